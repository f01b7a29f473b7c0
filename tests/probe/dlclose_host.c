/*
 * dlclose_host.c - a host that uses HDF5 itself and loads libampprobe as a
 * plugin (dlopen, one call, dlclose) keeps its own HDF5 files open and
 * usable. The library's HDF5 clean-up is an exit handler; registered from
 * a shared object it ran at dlclose and closed every HDF5 id of the host
 * (H5close), so the host's next write failed (hunt, 2026-12-04). The
 * library is now never unloaded (-z nodelete): its handler runs at the
 * process's exit only, where the host's files are flushed and closed.
 *
 * usage: dlclose_host LIBAMPPROBE.so DIR  (exit 0: passed; 1: failed)
 */
#include <dlfcn.h>
#include <hdf5.h>
#include <stdio.h>
#include <string.h>

static int fail(const char *what) {
  printf("FAIL: %s\n", what);
  return 1;
}

/* One case: the host's first HDF5 call before or after the dlopen. */
static int one(const char *lib, const char *dir, int before) {
  char path[1024];
  snprintf(path, sizeof path, "%s/host%d.h5", dir, before);
  hid_t f = -1;
  if (before) f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) return fail(dlerror());
  const char *(*ver)(void) = (const char *(*)(void))dlsym(h, "ampprobe_version");
  if (!ver || !ver()[0]) return fail("ampprobe_version");
  if (!before) f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return fail("H5Fcreate");
  if (dlclose(h) != 0) return fail("dlclose");
  if (H5Iis_valid(f) <= 0) return fail("the host's file id is no longer valid after dlclose");
  hsize_t d[1] = {4};
  hid_t sp = H5Screate_simple(1, d, NULL);
  hid_t ds = H5Dcreate2(f, "x", H5T_NATIVE_INT, sp, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT);
  int v[4] = {1, 2, 3, 4};
  if (ds < 0 || H5Dwrite(ds, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
    return fail("the host's write after dlclose");
  H5Dclose(ds);
  H5Sclose(sp);
  if (H5Fclose(f) < 0) return fail("H5Fclose");
  printf("ok:   host's first HDF5 call %s the dlopen: its file usable after dlclose\n",
         before ? "before" : "after");
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: dlclose_host LIBAMPPROBE.so DIR\n");
    return 2;
  }
  /* after first: HDF5 untouched by the host until the library is loaded */
  return one(argv[1], argv[2], 0) || one(argv[1], argv[2], 1);
}
