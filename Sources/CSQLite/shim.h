#include <sqlite3.h>

/* sqlite3_config and sqlite3_db_config are variadic, which Swift cannot call: the options
   Lockbox sets through them. */

/* Turns off SQLite's memory statistics, which take a process-wide mutex around every
   allocation (a row's text and blob columns are each one). Lockbox reads none of them. Takes
   effect only before SQLite initializes; later it returns SQLITE_MISUSE and changes nothing. */
static inline int lockbox_sqlite3_disable_memory_statistics(void) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

/* Leaves the write-ahead log in place when the last connection closes, instead of
   checkpointing it then (the next connection reads it as it is). */
static inline int lockbox_sqlite3_keep_wal_on_close(sqlite3 *db) {
    int enabled = 0;
    return sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, &enabled);
}
