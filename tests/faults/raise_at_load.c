/*
 * tests/faults/raise_at_load.c - an LD_PRELOAD shim for the fault test
 * interrupt_startup: its load-time constructor raises the signal named by
 * RAISE_AT_LOAD (TERM or INT), so the signal arrives while the libraries are
 * still initialising, before the program's main - the moment a user's
 * Ctrl-C or a scheduler's SIGTERM can hit a command that is just starting.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

__attribute__((constructor)) static void raise_at_load(void) {
  const char *s = getenv("RAISE_AT_LOAD");
  if (!s) return;
  raise(strcmp(s, "INT") == 0 ? SIGINT : SIGTERM);
}
