import LockboxCore

#if canImport(Glibc)
import Glibc
#endif

/// An open file descriptor, closed when the value goes away (also on every failure path).
final class FileDescriptor {
    let raw: Int32

    init(_ raw: Int32) {
        precondition(raw >= 0, "a FileDescriptor needs an open descriptor")
        self.raw = raw
    }

    deinit { close(raw) }

    /// `openat(2)`, retried on EINTR; nil with `errno` set when it fails.
    static func open(_ path: String, relativeTo directory: FileDescriptor? = nil, flags: Int32) -> FileDescriptor? {
        while true {
            let descriptor = openat(directory?.raw ?? AT_FDCWD, path, flags | O_CLOEXEC, 0)
            if descriptor >= 0 { return FileDescriptor(descriptor) }
            if errno != EINTR { return nil }
        }
    }

    /// `fstat(2)`; nil with `errno` set when it fails.
    func status() -> stat? {
        var status = stat()
        return fstat(raw, &status) == 0 ? status : nil
    }

    /// Reads to the end of the file, at most `limit` bytes; nil with `errno` set when a read
    /// fails, or (errno EFBIG) when the file is longer than `limit`.
    func readAll(limit: Int) -> [UInt8]? {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(raw, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if count == 0 { return bytes }
            bytes.append(contentsOf: chunk[0..<count])
            if bytes.count > limit {
                errno = EFBIG
                return nil
            }
        }
    }

    /// Feeds the whole file to `consume`, 64 KiB at a time; false with `errno` set when a read fails.
    func readChunks(_ consume: (UnsafeRawBufferPointer) -> Void) -> Bool {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer { buffer.deallocate() }
        while true {
            let count = read(raw, buffer.baseAddress, buffer.count)
            if count < 0 {
                if errno == EINTR { continue }
                return false
            }
            if count == 0 { return true }
            consume(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
        }
    }
}
