#include <sqlite3.h>

/// `sqlite3_db_config` is variadic, which Swift cannot call: the one option Lockbox sets through
/// it. Leaves the write-ahead log in place when the last connection closes, instead of
/// checkpointing it then (the next connection reads it as it is).
static inline int lockbox_sqlite3_keep_wal_on_close(sqlite3 *db) {
    int enabled = 0;
    return sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, &enabled);
}
