import LockboxCore
import Testing

@testable import LockboxVault

/// Regressions found by fuzzing the backup parser (docs/FUZZING.md, target `backup`).
@Suite("Parsing backup payloads")
struct BackupParsingTests {
    @Test("An item count with the top bit set throws errSecDecode instead of trapping")
    func decodeBackupItems_withNegativeCount_throwsDecode() {
        let payload: [UInt8] = [0, 0, 0, 0, 0, 0, 0, 0x80]
        #expect(throws: LockboxError.self) {
            try payload.withUnsafeBytes { bytes in _ = try Vault.decodeBackupItems(bytes) }
        }
        do {
            try payload.withUnsafeBytes { bytes in _ = try Vault.decodeBackupItems(bytes) }
        } catch let error as LockboxError {
            #expect(error.code == .decode)
        } catch {
            Issue.record("unexpected error \(error)")
        }
    }

    @Test("An item count larger than the payload throws errSecDecode")
    func decodeBackupItems_withCountBeyondPayload_throwsDecode() {
        let payload: [UInt8] = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]
        #expect(throws: LockboxError.self) {
            try payload.withUnsafeBytes { bytes in _ = try Vault.decodeBackupItems(bytes) }
        }
    }
}
