#if canImport(Glibc)
import Glibc
#endif

/// A directory entry's name, as `readdir` returns it.
package enum DirectoryEntry {
    /// The name of `entry`, read up to its terminating NUL, never further: the kernel's record
    /// is only as long as its name, so reading the whole 256-byte `d_name` (as copying the field
    /// does) can run past the end of the buffer `readdir` filled, and crash on the page after it.
    package static func name(_ entry: UnsafeMutablePointer<dirent>) -> String {
        let offset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
        let name = UnsafeRawPointer(entry).advanced(by: offset).assumingMemoryBound(to: CChar.self)
        return String(cString: name)
    }
}
