/* An LD_PRELOAD shim that records what a power cut could undo. Before every pwrite to a regular
 * file it appends the 4 KiB blocks' current contents (pre-images) to $POWERCUT_LOG/undo.<pid>;
 * every fsync/fdatasync appends a sync mark. After SIGKILLing the daemon, tests/crash.rs replays
 * the log: each block written since its file's last sync independently keeps its new contents
 * or reverts to what it held at that sync — the reordering a disk cache may do on power loss.
 * (Size changes and hole punches are taken as durable: the lower file system journals them.)
 * Entry: u8 kind (1 = pre-image, 2 = sync), u64 dev, u64 ino, then for pre-images u64 offset
 * and 4096 bytes. Built by tests/crash.rs with cc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define BLOCK 4096
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef int (*sync_fn)(int);

static int logger(void) {
    if (log_fd >= 0)
        return log_fd;
    const char *dir = getenv("POWERCUT_LOG");
    if (!dir)
        return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/undo.%d", dir, (int)getpid());
    log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    return log_fd;
}

static void put(const void *p, size_t n) {
    write_fn real_write = (write_fn)dlsym(RTLD_NEXT, "write");
    const char *c = p;
    while (n > 0) {
        ssize_t w = real_write(log_fd, c, n);
        if (w <= 0)
            return;
        c += w;
        n -= (size_t)w;
    }
}

static int regular(int fd, struct stat *st) {
    return fstat(fd, st) == 0 && S_ISREG(st->st_mode);
}

static void record(int fd, size_t count, off_t offset) {
    struct stat st;
    if (count == 0 || !regular(fd, &st))
        return;
    pread_fn real_pread = (pread_fn)dlsym(RTLD_NEXT, "pread64");
    pthread_mutex_lock(&lock);
    if (logger() >= 0) {
        for (off_t b = offset / BLOCK * BLOCK; b < offset + (off_t)count; b += BLOCK) {
            unsigned char buf[BLOCK];
            memset(buf, 0, sizeof buf);
            ssize_t got = real_pread(fd, buf, BLOCK, b);
            (void)got;
            uint8_t kind = 1;
            uint64_t dev = st.st_dev, ino = st.st_ino, off = (uint64_t)b;
            put(&kind, 1), put(&dev, 8), put(&ino, 8), put(&off, 8), put(buf, BLOCK);
        }
    }
    pthread_mutex_unlock(&lock);
}

static void mark_sync(int fd) {
    struct stat st;
    if (!regular(fd, &st))
        return;
    pthread_mutex_lock(&lock);
    if (logger() >= 0) {
        uint8_t kind = 2;
        uint64_t dev = st.st_dev, ino = st.st_ino;
        put(&kind, 1), put(&dev, 8), put(&ino, 8);
    }
    pthread_mutex_unlock(&lock);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    record(fd, count, offset);
    return ((pwrite_fn)dlsym(RTLD_NEXT, "pwrite64"))(fd, buf, count, offset);
}
ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    record(fd, count, offset);
    return ((pwrite_fn)dlsym(RTLD_NEXT, "pwrite"))(fd, buf, count, offset);
}
/* The sync mark goes in only once the sync succeeded: a failed sync makes nothing durable. */
int fsync(int fd) {
    int r = ((sync_fn)dlsym(RTLD_NEXT, "fsync"))(fd);
    if (r == 0)
        mark_sync(fd);
    return r;
}
int fdatasync(int fd) {
    int r = ((sync_fn)dlsym(RTLD_NEXT, "fdatasync"))(fd);
    if (r == 0)
        mark_sync(fd);
    return r;
}
