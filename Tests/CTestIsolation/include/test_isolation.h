#ifndef LOCKBOX_TEST_ISOLATION_H
#define LOCKBOX_TEST_ISOLATION_H

/// The temporary home that every process linking this target got before `main` (HOME and the
/// XDG base directories point into it); NULL if it could not be made (the process then exits).
const char *lockbox_test_home(void);

/// HOME as the process was started with it (the real home, or an outer test run's sandbox).
const char *lockbox_test_original_home(void);

#endif
