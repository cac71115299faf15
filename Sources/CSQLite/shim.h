#include <sqlite3.h>

/* Turns off SQLite's memory statistics, which take a process-wide mutex around every
   allocation (a row's text and blob columns are each one). Lockbox reads none of them. Takes
   effect only before SQLite initializes; later it returns SQLITE_MISUSE and changes nothing.
   (sqlite3_config is variadic, which Swift cannot call.) */
static inline int lockbox_sqlite3_disable_memory_statistics(void) {
    return sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}
