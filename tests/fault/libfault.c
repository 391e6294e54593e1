/* An LD_PRELOAD shim that makes the lower file system fail like a bad or full disk, for chosen
 * files: I/O on a file whose path contains ".eio-read" (pread), ".eio-write" (pwrite, fallocate)
 * or ".eio-sync" (fsync, fdatasync) fails with EIO; pwrite and fallocate on a file whose path
 * contains ".enospc-write" fail with ENOSPC (as when another program fills the disk). Renaming a
 * file in or out of such a name turns the fault on or off while the daemon runs. Built by
 * tests/reliability.rs with cc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int marked(int fd, const char *tag) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return 0;
    path[n] = 0;
    return strstr(path, tag) != NULL;
}

#define FAIL_WITH(fd, tag, error) \
    if (marked(fd, tag)) {        \
        errno = error;            \
        return -1;                \
    }
#define FAIL_IF(fd, tag) FAIL_WITH(fd, tag, EIO)
#define FAIL_WRITE(fd)                           \
    FAIL_WITH(fd, ".eio-write", EIO);            \
    FAIL_WITH(fd, ".enospc-write", ENOSPC)
#define REAL(type, name, ...) ((type(*)(__VA_ARGS__))dlsym(RTLD_NEXT, name))

ssize_t pread64(int fd, void *buf, size_t count, off_t offset) {
    FAIL_IF(fd, ".eio-read");
    return REAL(ssize_t, "pread64", int, void *, size_t, off_t)(fd, buf, count, offset);
}
ssize_t pread(int fd, void *buf, size_t count, off_t offset) {
    FAIL_IF(fd, ".eio-read");
    return REAL(ssize_t, "pread", int, void *, size_t, off_t)(fd, buf, count, offset);
}
ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    FAIL_WRITE(fd);
    return REAL(ssize_t, "pwrite64", int, const void *, size_t, off_t)(fd, buf, count, offset);
}
ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    FAIL_WRITE(fd);
    return REAL(ssize_t, "pwrite", int, const void *, size_t, off_t)(fd, buf, count, offset);
}
int fallocate64(int fd, int mode, off_t offset, off_t len) {
    FAIL_WRITE(fd);
    return REAL(int, "fallocate64", int, int, off_t, off_t)(fd, mode, offset, len);
}
int fallocate(int fd, int mode, off_t offset, off_t len) {
    FAIL_WRITE(fd);
    return REAL(int, "fallocate", int, int, off_t, off_t)(fd, mode, offset, len);
}
int fsync(int fd) {
    FAIL_IF(fd, ".eio-sync");
    return REAL(int, "fsync", int)(fd);
}
int fdatasync(int fd) {
    FAIL_IF(fd, ".eio-sync");
    return REAL(int, "fdatasync", int)(fd);
}
