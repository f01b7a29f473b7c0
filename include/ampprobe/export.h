/*
 * ampprobe/export.h - the one export macro of the ampprobe library.
 *
 * The library is built with hidden visibility by default; every public
 * declaration carries AMPPROBE_API so that it, and nothing else, is exported
 * from libampprobe.so. Internal functions shared between the library's own
 * files use the `probe__` prefix and no macro, so a host program never sees
 * them. A program linking the static library needs nothing defined.
 */
#ifndef AMPPROBE_EXPORT_H
#define AMPPROBE_EXPORT_H

#if defined(_WIN32)
#define AMPPROBE_API
#elif defined(__GNUC__) || defined(__clang__)
#define AMPPROBE_API __attribute__((visibility("default")))
#else
#define AMPPROBE_API
#endif

#endif /* AMPPROBE_EXPORT_H */
