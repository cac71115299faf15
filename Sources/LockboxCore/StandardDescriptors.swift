#if canImport(Glibc)
import Glibc
#endif

/// Keeps the files Lockbox holds open off the standard descriptors (0, 1, 2).
///
/// A program started with one of them closed hands that number to the next file it opens. A lock
/// file Lockbox keeps open would then receive whatever the program prints (a secret written to
/// standard output ended up in clear in `VAULT.broker`), or be read as its standard input. The
/// command-line programs reserve the three at start (`lockbox_harden_process`); a library call
/// in any other program moves such a file to a higher descriptor instead.
package enum StandardDescriptors {
    /// `descriptor` itself when it is above 2 (or negative: a failed open), else a duplicate above
    /// 2 (close-on-exec) with `descriptor` closed. Should the duplicate fail, `descriptor` is
    /// closed and -1 returned with `errno` set, as a failed open.
    package static func movedAbove(_ descriptor: Int32) -> Int32 {
        guard descriptor >= 0 && descriptor <= 2 else { return descriptor }
        let moved = fcntl(descriptor, F_DUPFD_CLOEXEC, 3)
        let failure = errno
        close(descriptor)
        errno = failure
        return moved
    }
}
