// A VFS over SQLite's `unix` VFS that gathers a write-ahead log's writes.
//
// SQLite writes each WAL frame as two `pwrite` calls (its 24-byte header, then the page), so a
// commit that changes eight pages makes sixteen system calls before its `fdatasync`. Here the
// writes that continue one another are copied into a buffer and given to the file in one call
// when SQLite next does anything else with the log: read it, ask its size, truncate, sync or
// close it, change it through a file control, or write somewhere that does not follow on. The
// sync therefore covers exactly the bytes it covered before, in the same order: durability and
// what other connections can see (only frames a synced commit made visible through the
// wal-index) do not change. A failed write is reported by the operation that flushed it, which
// SQLite treats like the write's own failure (the transaction is rolled back).
//
// Only files opened with SQLITE_OPEN_WAL are wrapped. Every other file is `unix`'s own file
// object, placed at the start of the memory SQLite gives, so code that looks at the database's
// file (its descriptor, through SQLITE_FCNTL_FILE_POINTER) sees what it always saw.

#include <sqlite3.h>
#include <stddef.h>
#include <string.h>
#include <pthread.h>

#include "write_ahead_buffer.h"

const char *const lockbox_write_ahead_buffer_vfs = "lockbox-wal-buffer";

// Room for a commit of about 30 frames of 4 KiB; a larger transaction flushes as it goes.
// `unix` takes at most 128 KiB - 1 per write (it masks the count with 0x1ffff: a page of at most
// 64 KiB and a frame header never need more), so a flush stays under that.
enum { buffer_capacity = 120 * 1024 };

typedef struct {
    sqlite3_file base;
    // `unix`'s file object, just after this one (see `szOsFile`).
    sqlite3_file *real;
    unsigned char *buffer;
    // The file offset of buffer[0], and how many bytes are waiting.
    sqlite3_int64 start;
    int used;
} BufferedLog;

static sqlite3_vfs *underlying;
static sqlite3_vfs buffered_vfs;

static int flush(BufferedLog *log) {
    if (log->used == 0) return SQLITE_OK;
    int used = log->used;
    log->used = 0;
    return log->real->pMethods->xWrite(log->real, log->buffer, used, log->start);
}

static int log_close(sqlite3_file *file) {
    BufferedLog *log = (BufferedLog *)file;
    int flushed = flush(log);
    int closed = log->real->pMethods->xClose(log->real);
    sqlite3_free(log->buffer);
    log->buffer = NULL;
    return flushed != SQLITE_OK ? flushed : closed;
}

static int log_read(sqlite3_file *file, void *data, int amount, sqlite3_int64 offset) {
    BufferedLog *log = (BufferedLog *)file;
    int rc = flush(log);
    if (rc != SQLITE_OK) return rc;
    return log->real->pMethods->xRead(log->real, data, amount, offset);
}

static int log_write(sqlite3_file *file, const void *data, int amount, sqlite3_int64 offset) {
    BufferedLog *log = (BufferedLog *)file;
    if (log->used > 0 && offset == log->start + log->used && amount <= buffer_capacity - log->used) {
        memcpy(log->buffer + log->used, data, (size_t)amount);
        log->used += amount;
        return SQLITE_OK;
    }
    int rc = flush(log);
    if (rc != SQLITE_OK) return rc;
    if (log->buffer == NULL) log->buffer = sqlite3_malloc(buffer_capacity);
    if (log->buffer == NULL || amount > buffer_capacity) {
        return log->real->pMethods->xWrite(log->real, data, amount, offset);
    }
    memcpy(log->buffer, data, (size_t)amount);
    log->start = offset;
    log->used = amount;
    return SQLITE_OK;
}

static int log_truncate(sqlite3_file *file, sqlite3_int64 size) {
    BufferedLog *log = (BufferedLog *)file;
    int rc = flush(log);
    if (rc != SQLITE_OK) return rc;
    return log->real->pMethods->xTruncate(log->real, size);
}

static int log_sync(sqlite3_file *file, int flags) {
    BufferedLog *log = (BufferedLog *)file;
    int rc = flush(log);
    if (rc != SQLITE_OK) return rc;
    return log->real->pMethods->xSync(log->real, flags);
}

static int log_file_size(sqlite3_file *file, sqlite3_int64 *size) {
    BufferedLog *log = (BufferedLog *)file;
    int rc = flush(log);
    if (rc != SQLITE_OK) return rc;
    return log->real->pMethods->xFileSize(log->real, size);
}

static int log_lock(sqlite3_file *file, int level) {
    BufferedLog *log = (BufferedLog *)file;
    return log->real->pMethods->xLock(log->real, level);
}

static int log_unlock(sqlite3_file *file, int level) {
    BufferedLog *log = (BufferedLog *)file;
    return log->real->pMethods->xUnlock(log->real, level);
}

static int log_check_reserved_lock(sqlite3_file *file, int *reserved) {
    BufferedLog *log = (BufferedLog *)file;
    return log->real->pMethods->xCheckReservedLock(log->real, reserved);
}

static int log_file_control(sqlite3_file *file, int op, void *argument) {
    BufferedLog *log = (BufferedLog *)file;
    int rc = flush(log);
    if (rc != SQLITE_OK) return rc;
    return log->real->pMethods->xFileControl(log->real, op, argument);
}

static int log_sector_size(sqlite3_file *file) {
    BufferedLog *log = (BufferedLog *)file;
    return log->real->pMethods->xSectorSize(log->real);
}

static int log_device_characteristics(sqlite3_file *file) {
    BufferedLog *log = (BufferedLog *)file;
    return log->real->pMethods->xDeviceCharacteristics(log->real);
}

// A log has no shared memory or memory map of its own (the database file has them); version 1
// methods are all SQLite calls on it.
static const sqlite3_io_methods log_methods = {
    1,
    log_close,
    log_read,
    log_write,
    log_truncate,
    log_sync,
    log_file_size,
    log_lock,
    log_unlock,
    log_check_reserved_lock,
    log_file_control,
    log_sector_size,
    log_device_characteristics,
    NULL, NULL, NULL, NULL, NULL, NULL,
};

static int buffered_open(sqlite3_vfs *vfs, sqlite3_filename name, sqlite3_file *file, int flags, int *out_flags) {
    (void)vfs;
    if ((flags & SQLITE_OPEN_WAL) == 0) {
        // `unix`'s own file object, in place.
        return underlying->xOpen(underlying, name, file, flags, out_flags);
    }
    BufferedLog *log = (BufferedLog *)file;
    memset(log, 0, sizeof *log);
    log->real = (sqlite3_file *)((unsigned char *)file + sizeof(BufferedLog));
    int rc = underlying->xOpen(underlying, name, log->real, flags, out_flags);
    if (rc != SQLITE_OK) {
        // SQLite does not close a file whose methods are NULL; `unix` closed its own already.
        log->base.pMethods = NULL;
        return rc;
    }
    log->base.pMethods = &log_methods;
    return SQLITE_OK;
}

static pthread_once_t registration = PTHREAD_ONCE_INIT;
static int registration_result = SQLITE_ERROR;

static void register_once(void) {
    underlying = sqlite3_vfs_find("unix");
    if (underlying == NULL) {
        registration_result = SQLITE_ERROR;
        return;
    }
    // Everything but opening files is `unix`'s (its methods work from the fields copied here).
    buffered_vfs = *underlying;
    buffered_vfs.pNext = NULL;
    buffered_vfs.zName = lockbox_write_ahead_buffer_vfs;
    size_t wrapped = sizeof(BufferedLog) + (size_t)underlying->szOsFile;
    buffered_vfs.szOsFile = (int)(wrapped > (size_t)underlying->szOsFile ? wrapped : (size_t)underlying->szOsFile);
    buffered_vfs.xOpen = buffered_open;
    registration_result = sqlite3_vfs_register(&buffered_vfs, 0);
}

int lockbox_register_write_ahead_buffer(void) {
    pthread_once(&registration, register_once);
    return registration_result;
}
