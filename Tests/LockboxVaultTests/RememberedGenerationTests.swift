import Foundation
import Testing

@testable import LockboxVault

/// The generation remembered outside the vault file is one mapped page that every process
/// (here: every instance) shares: advancing is a maximum, reading sees the others' writes.
@Suite("Remembered generation")
struct RememberedGenerationTests {
    let directory: String
    let device: DeviceIdentity
    let vaultID = [UInt8](repeating: 0xA5, count: 16)

    init() throws {
        directory = NSTemporaryDirectory() + "lockbox-generation-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        device = DeviceIdentity(keyPath: directory + "/state/device-key", machineIDPath: "/etc/machine-id")
    }

    func record() -> RememberedGeneration {
        RememberedGeneration(vaultID: vaultID, vaultPath: directory + "/vault.lockbox", device: device)
    }

    @Test("nothing remembered reads 0 and creates no file; the first advance creates it private")
    func firstAdvanceCreatesTheFile() throws {
        let generation = record()
        #expect(generation.read() == 0)
        #expect(!generation.exists)
        generation.advance(to: 7)
        #expect(generation.read() == 7)
        let attributes = try FileManager.default.attributesOfItem(atPath: generation.path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        #expect((attributes[.size] as? Int) == 8)
    }

    @Test("an advance by one instance is read by another, and a lower one never moves it back")
    func advanceIsSharedAndMonotonic() {
        let first = record()
        let second = record()
        first.advance(to: 10)
        #expect(second.read() == 10)
        second.advance(to: 4)
        #expect(first.read() == 10)
        second.advance(to: 12)
        #expect(first.read() == 12)
        // Accepting an older file on purpose sets exactly the value given, for everyone.
        first.write(3)
        #expect(second.read() == 3)
    }

    @Test("concurrent advances from many threads leave the highest value")
    func concurrentAdvancesKeepTheMaximum() {
        let vaultID = vaultID, directory = directory, device = device
        DispatchQueue.concurrentPerform(iterations: 4) { thread in
            // One instance per thread, as one per process: they share the mapped page.
            let generation = RememberedGeneration(vaultID: vaultID, vaultPath: directory + "/vault.lockbox", device: device)
            for step in 0..<1_000 { generation.advance(to: step * 4 + thread + 1) }
        }
        #expect(record().read() == 4_000)
    }

    @Test("the bytes are the little-endian value a reader of the file finds")
    func storedBytesAreLittleEndian() throws {
        let generation = record()
        generation.advance(to: 0x0102_0304)
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: generation.path)))
        #expect(bytes == [0x04, 0x03, 0x02, 0x01, 0, 0, 0, 0])
    }

    @Test("a file cut short holds no generation: read as 0, grown back by the next advance")
    func shortFileReadsZero() throws {
        let path = record().path
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try Data([9, 9, 9]).write(to: URL(fileURLWithPath: path))
        let generation = record()
        #expect(generation.read() == 0)
        generation.advance(to: 5)
        #expect(generation.read() == 5)
        #expect(record().read() == 5)
    }
}
