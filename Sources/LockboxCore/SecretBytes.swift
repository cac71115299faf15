import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One guarded mapping: guard page, one data page, guard page. Released one-page mappings are
/// zeroed and kept for reuse, so a steady stream of small secrets costs no system calls.
private struct GuardedRegion: @unchecked Sendable {
    // Owned by the pool while pooled, by exactly one SecretBytes otherwise.
    let mapping: UnsafeMutableRawPointer
}

private let regionPool = Mutex<[GuardedRegion]>([])
private let regionPoolLimit = 256

/// Bytes of a secret held in memory: a token, a password, a key.
///
/// The bytes live in their own page-aligned mapping with an inaccessible guard page on each
/// side, locked into RAM where the system allows it (never swapped), excluded from core dumps,
/// and overwritten with zeros when the last reference goes away. They are reachable only
/// through ``withUnsafeBytes(_:)``; `description` prints `<redacted>`; `==` takes the same
/// time whatever the contents.
///
/// ```swift
/// let token = SecretBytes(copying: Array("s3cr3t".utf8))
/// token.withUnsafeBytes { bytes in send(bytes) }
/// ```
public final class SecretBytes: @unchecked Sendable {
    // Immutable after init; the mapping is owned by this object alone, so sharing the
    // reference across threads shares only reads.
    private let mapping: UnsafeMutableRawPointer
    private let mappingSize: Int
    private let start: UnsafeMutableRawPointer
    /// Bytes handed to the initializer: the only ones that can be non-zero.
    private let capacity: Int
    /// The number of bytes. Lengths are not treated as secret.
    public let count: Int

    private static let pageSize: Int = {
        let size = sysconf(Int32(_SC_PAGESIZE))
        return size > 0 ? Int(size) : 4096
    }()

    /// Allocates `capacity` guarded bytes, lets `initializer` write them, and keeps the first
    /// `initializer`'s return value bytes (the rest are zeroed). Use this to read a secret
    /// straight into protected memory without an intermediate copy.
    public init<E: Error>(
        capacity: Int,
        initializingWith initializer: (UnsafeMutableRawBufferPointer) throws(E) -> Int
    ) throws(E) {
        precondition(capacity >= 0, "SecretBytes capacity must not be negative")
        let page = Self.pageSize
        let dataPages = max(1, (capacity + page - 1) / page)
        let size = (dataPages + 2) * page
        let raw: UnsafeMutableRawPointer
        if dataPages == 1, let pooled = regionPool.withLock({ $0.popLast() }) {
            raw = pooled.mapping
        } else {
            guard let mapped = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
                mapped != MAP_FAILED
            else {
                fatalError("SecretBytes: out of memory mapping \(size) bytes")
            }
            raw = mapped
            // Guard pages: touching them crashes instead of reading a neighbour's secret. A
            // guard that did not apply would be a promise silently broken: stop.
            guard mprotect(raw, page, PROT_NONE) == 0, mprotect(raw + (dataPages + 1) * page, page, PROT_NONE) == 0 else {
                fatalError("SecretBytes: mprotect of a guard page failed (errno \(errno))")
            }
            // Best effort, as libsodium does: RLIMIT_MEMLOCK may forbid it.
            _ = mlock(raw + page, dataPages * page)
            #if canImport(Glibc)
            _ = madvise(raw + page, dataPages * page, MADV_DONTDUMP)
            #endif
        }
        mapping = raw
        mappingSize = size
        let dataStart = raw + page
        // Place the bytes at the end of the data pages so an overrun hits the guard page.
        start = dataStart + (dataPages * page - capacity)
        self.capacity = capacity
        let buffer = UnsafeMutableRawBufferPointer(start: start, count: capacity)
        let written: Int
        do {
            written = try initializer(buffer)
        } catch {
            Self.release(mapping: raw, size: size, dataStart: dataStart, dataBytes: dataPages * page, used: buffer)
            throw error
        }
        precondition(written >= 0 && written <= capacity, "SecretBytes initializer wrote past its capacity")
        if written < capacity {
            wipe(UnsafeMutableRawBufferPointer(rebasing: buffer[written...]))
        }
        count = written
    }

    /// Copies `bytes` into guarded memory. The caller stays responsible for its own copy.
    public convenience init(copying bytes: some Sequence<UInt8>) {
        let array = Array(bytes)
        self.init(capacity: array.count) { buffer in
            buffer.copyBytes(from: array)
            return array.count
        }
    }

    /// Copies the bytes behind `pointer` into guarded memory.
    public convenience init(copying pointer: UnsafeRawBufferPointer) {
        self.init(capacity: pointer.count) { buffer in
            if let base = pointer.baseAddress, pointer.count > 0 {
                buffer.baseAddress!.copyMemory(from: base, byteCount: pointer.count)
            }
            return pointer.count
        }
    }

    /// The UTF-8 bytes of `string`. Prefer reading secrets straight into `SecretBytes`;
    /// a `String` leaves copies that cannot be wiped.
    public convenience init(utf8 string: String) {
        self.init(copying: Array(string.utf8))
    }

    /// Zero bytes.
    public static var empty: SecretBytes { SecretBytes(capacity: 0) { _ in 0 } }

    deinit {
        let page = Self.pageSize
        let dataBytes = mappingSize - 2 * page
        Self.release(
            mapping: mapping, size: mappingSize, dataStart: mapping + page, dataBytes: dataBytes,
            used: UnsafeMutableRawBufferPointer(start: start, count: capacity))
    }

    /// Zeroes the bytes that were in use (the rest of the page was never written and is
    /// still zero), then pools or unmaps the region.
    private static func release(
        mapping: UnsafeMutableRawPointer, size: Int, dataStart: UnsafeMutableRawPointer, dataBytes: Int,
        used: UnsafeMutableRawBufferPointer
    ) {
        wipe(used)
        if dataBytes == pageSize {
            let kept = regionPool.withLock { pool in
                guard pool.count < regionPoolLimit else { return false }
                pool.append(GuardedRegion(mapping: mapping))
                return true
            }
            if kept { return }
        }
        _ = munlock(dataStart, dataBytes)
        munmap(mapping, size)
    }

    /// Calls `body` with the secret's bytes. Do not let the pointer escape.
    public func withUnsafeBytes<Result, E: Error>(
        _ body: (UnsafeRawBufferPointer) throws(E) -> Result
    ) throws(E) -> Result {
        try body(UnsafeRawBufferPointer(start: start, count: count))
    }

    /// Whether there are no bytes.
    public var isEmpty: Bool { count == 0 }
}

extension SecretBytes: Equatable {
    /// Constant-time comparison of the contents (lengths are compared first; they are public).
    public static func == (lhs: SecretBytes, rhs: SecretBytes) -> Bool {
        guard lhs.count == rhs.count else { return false }
        return lhs.withUnsafeBytes { left in
            rhs.withUnsafeBytes { right in constantTimeEquals(left, right) }
        }
    }
}

extension SecretBytes: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// `<redacted>`, whatever the bytes.
    public var description: String { "<redacted>" }
    /// `SecretBytes(<redacted>, N bytes)`: the length, never the bytes.
    public var debugDescription: String { "SecretBytes(<redacted>, \(count) bytes)" }
    /// A mirror with no children, so `dump` shows no bytes.
    public var customMirror: Mirror { Mirror(self, children: [], displayStyle: .struct) }
}

/// Compares two equally long buffers without an early exit.
package func constantTimeEquals(_ left: UnsafeRawBufferPointer, _ right: UnsafeRawBufferPointer) -> Bool {
    guard left.count == right.count else { return false }
    var difference: UInt8 = 0
    for index in 0..<left.count {
        difference |= left[index] ^ right[index]
    }
    return difference == 0
}

/// Overwrites memory with zeros in a way the optimizer may not remove.
package func wipe(_ buffer: UnsafeMutableRawBufferPointer) {
    guard let base = buffer.baseAddress, buffer.count > 0 else { return }
    #if canImport(Glibc)
    explicit_bzero(base, buffer.count)
    #else
    memset_s(base, buffer.count, 0, buffer.count)
    #endif
}

extension Array where Element == UInt8 {
    /// Zeros the array's storage in place (for transient copies of key material).
    package mutating func wipe() {
        withUnsafeMutableBytes { LockboxCore.wipe($0) }
    }
}
