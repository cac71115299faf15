#ifndef LOCKBOX_PROCESS_HARDENING_H
#define LOCKBOX_PROCESS_HARDENING_H

/// Opens /dev/null on each of the standard descriptors (0, 1, 2) that is closed, so that no file
/// this process opens later takes one of them: a program started with standard output closed
/// would otherwise print a secret into whatever file took descriptor 1 (a lock file), or read
/// one as its standard input. Returns 0 on success, -1 if one could not be opened.
int lockbox_reserve_standard_descriptors(void);

/// Reserves the standard descriptors (``lockbox_reserve_standard_descriptors``; call that first,
/// before anything opens a file or socket), then makes this process refuse core dumps and
/// ptrace attachment by other processes of the same user (PR_SET_DUMPABLE 0, RLIMIT_CORE 0).
/// Returns 0 on success, -1 if either of those two steps failed.
int lockbox_harden_process(void);

/// 1 when this process is marked non-dumpable.
int lockbox_process_is_dumpable(void);

#endif
