import Foundation
import Testing

@testable import LockboxCore

/// What SecretBytes promises about its memory: a guard page on each side (touching one
/// crashes), the bytes at the very end of their pages (an overrun hits the guard at once),
/// excluded from core dumps, and zeros left behind when the secret goes away.
@Suite("SecretBytes memory: guard pages and zeroing")
struct SecretBytesMemoryTests {
    static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))

    /// The mapping of /proc/self/smaps that contains `address`: its permissions and VmFlags.
    static func mapping(containing address: UInt) -> (permissions: String, flags: [String])? {
        // /proc files report a size of 0: read to the end rather than trust the size.
        guard let file = FileHandle(forReadingAtPath: "/proc/self/smaps"), let data = try? file.readToEnd() else { return nil }
        let text = String(decoding: data, as: UTF8.self)
        var current: (range: ClosedRange<UInt>, permissions: String)?
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            if let first = fields.first, first.contains("-"), fields.count >= 2,
                let dash = first.firstIndex(of: "-"),
                let low = UInt(first[..<dash], radix: 16), let high = UInt(first[first.index(after: dash)...], radix: 16)
            {
                current = (low...(high - 1), String(fields[1]))
            } else if line.hasPrefix("VmFlags:"), let mapping = current, mapping.range.contains(address) {
                return (mapping.permissions, fields.dropFirst().map(String.init))
            }
        }
        return nil
    }

    @Test(
        "the bytes end at a page boundary, between two inaccessible pages, and are not dumped",
        arguments: [1, 32, 100, 4096, 4097, 10_000])
    func layout_guardPagesOnBothSides(size: Int) throws {
        let secret = SecretBytes(copying: [UInt8](repeating: 0xA5, count: size))
        let (start, end) = secret.withUnsafeBytes { bytes in
            (UInt(bitPattern: bytes.baseAddress!), UInt(bitPattern: bytes.baseAddress!) + UInt(bytes.count))
        }
        let page = UInt(Self.pageSize)
        #expect(end % page == 0, "the bytes do not end at a page boundary")
        let dataPages = UInt(max(1, (size + Self.pageSize - 1) / Self.pageSize))
        let dataStart = end - dataPages * page
        #expect(start >= dataStart)
        let before = try #require(Self.mapping(containing: dataStart - 1))
        let data = try #require(Self.mapping(containing: start))
        let after = try #require(Self.mapping(containing: end))
        #expect(before.permissions == "---p")
        #expect(after.permissions == "---p")
        #expect(data.permissions == "rw-p")
        #expect(data.flags.contains("dd"), "the data pages are not excluded from core dumps: \(data.flags)")
        withExtendedLifetime(secret) {}
    }

    @Test("reading one byte past the end crashes instead of reading a neighbour")
    func overrun_crashes() async {
        await #expect(processExitsWith: .signal(SIGSEGV)) {
            let secret = SecretBytes(copying: [UInt8](repeating: 1, count: 24))
            let byte = secret.withUnsafeBytes { bytes in
                UnsafeRawPointer(bytes.baseAddress!).advanced(by: bytes.count).load(as: UInt8.self)
            }
            print(byte)
        }
    }

    @Test("reading one byte before the first data page crashes")
    func underrun_crashes() async {
        await #expect(processExitsWith: .signal(SIGSEGV)) {
            let secret = SecretBytes(copying: [UInt8](repeating: 1, count: 4096))
            let byte = secret.withUnsafeBytes { bytes in
                UnsafeRawPointer(bytes.baseAddress!).advanced(by: -1).load(as: UInt8.self)
            }
            print(byte)
        }
    }

    @Test("a released secret leaves zeros where its bytes were")
    func release_zeroesTheBytes() async {
        // In a process of its own, so no other test takes the pooled page in between.
        await #expect(processExitsWith: .success) {
            var address: UnsafeRawPointer?
            do {
                let secret = SecretBytes(copying: [UInt8](repeating: 0xA5, count: 64))
                address = secret.withUnsafeBytes { UnsafeRawPointer($0.baseAddress!) }
                #expect(address!.load(as: UInt8.self) == 0xA5)
            }
            // A one-page region stays mapped (it is pooled for reuse): it can be read.
            let left = UnsafeRawBufferPointer(start: address!, count: 64)
            exit(left.allSatisfy { $0 == 0 } ? EXIT_SUCCESS : EXIT_FAILURE)
        }
    }

    @Test("bytes beyond what an initializer wrote are zeros, not what it left behind")
    func initializer_tailIsZeroed() {
        let secret = SecretBytes(capacity: 16) { buffer in
            for index in buffer.indices { buffer[index] = 0xFF }
            return 4
        }
        #expect(secret.count == 4)
        let tail = secret.withUnsafeBytes { bytes in
            UnsafeRawBufferPointer(start: bytes.baseAddress! + 4, count: 12).map { $0 }
        }
        #expect(tail == [UInt8](repeating: 0, count: 12))
    }

    @Test("wipe zeroes a buffer in place")
    func wipe_zeroesBuffer() {
        var bytes: [UInt8] = Array(repeating: 0x5A, count: 33)
        bytes.wipe()
        #expect(bytes == [UInt8](repeating: 0, count: 33))
        #expect(constantTimeEquals(UnsafeRawBufferPointer(start: nil, count: 0), UnsafeRawBufferPointer(start: nil, count: 0)))
    }
}
