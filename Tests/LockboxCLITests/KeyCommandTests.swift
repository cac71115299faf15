import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// The key verbs and the TPM unlock through the built `lockbox` (which runs `lockbox-keys` for
/// them), against a software TPM of the test's own.
@Suite("lockbox key commands and TPM unlock, end to end")
struct KeyCommandTests {
    let binary = builtProduct("lockbox")
    let directory = TemporaryDirectory("lockbox-keys-cli")
    var keychain: String { directory.file("keychains/keys.lockbox") }
    static let passphrase = Array("keys passphrase\n".utf8)

    func lockbox(_ arguments: [String], input: [UInt8] = [], tpm: PrivateTPM?, device: String? = nil) throws -> ProcessResult {
        #expect(FileManager.default.isExecutableFile(atPath: builtProduct("lockbox-keys")), "lockbox-keys is not built")
        var environment = ProcessInfo.processInfo.environment
        environment["LOCKBOX_TPM_TCTI"] = device ?? tpm?.device
        environment["XDG_STATE_HOME"] = directory.file("state")
        return try run(binary, ["--keychain", keychain] + arguments, input: input, environment: environment)
    }

    @Test func hardwareKey_generateSignPublicKeyDumpStatusDelete() throws {
        let tpm = try PrivateTPM()
        #expect(try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], input: Self.passphrase, tpm: tpm).status == 0)
        defer { _ = try? lockbox(["lock", "--all"], tpm: tpm) }

        let made = try lockbox(["generate-key", "--tag", "deploy", "--hardware"], tpm: tpm)
        #expect(made.status == 0, "generate-key failed: \(made.standardError)")
        #expect(made.standardOutput.hasPrefix("-----BEGIN PUBLIC KEY-----"))
        #expect(made.standardError.contains("hardware (TPM)"))

        let message = Array("sign me, from standard input".utf8)
        let signed = try lockbox(["sign", "--tag", "deploy", "--raw"], input: message, tpm: tpm)
        #expect(signed.status == 0, "sign failed: \(signed.standardError)")
        let pem = directory.file("deploy.pem")
        try made.standardOutput.write(toFile: pem, atomically: true, encoding: .utf8)
        try Data(message).write(to: URL(fileURLWithPath: directory.file("message")))
        try Data(signed.standardOutputBytes).write(to: URL(fileURLWithPath: directory.file("signature")))
        let verified = try run(
            "/usr/bin/openssl", ["dgst", "-sha256", "-verify", pem, "-signature", directory.file("signature"), directory.file("message")])
        #expect(verified.standardOutput.contains("Verified OK"), "openssl did not verify: \(verified.standardError)")

        let openSSH = try lockbox(["public-key", "--tag", "deploy", "--format", "openssh"], tpm: tpm)
        #expect(openSSH.standardOutput.hasPrefix("ecdsa-sha2-nistp256 AAAA"))
        #expect(try lockbox(["public-key", "--tag", "deploy"], tpm: tpm).standardOutput == made.standardOutput)

        let dump = try lockbox(["dump"], tpm: tpm)
        #expect(dump.standardOutput.contains("applicationTag: deploy"))
        #expect(dump.standardOutput.contains("token: hardware (TPM)"))
        let status = try lockbox(["status"], tpm: tpm)
        #expect(status.standardOutput.contains("tpm: in use: 1 hardware key"))

        #expect(try lockbox(["delete-key", "--tag", "deploy"], tpm: tpm).status == 0)
        #expect(try lockbox(["sign", "--tag", "deploy"], input: message, tpm: tpm).status == 44)
        #expect(try lockbox(["status"], tpm: tpm).standardOutput.contains("tpm: not in use"))
    }

    @Test("careless use of the key verbs: a delete naming several keys, an unlabelled key beside labelled ones, an empty --purpose, a comment with a newline, a locked listing")
    func carelessKeyUse_isRefusedOrSaid() throws {
        #expect(try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], input: Self.passphrase, tpm: nil).status == 0)
        defer { _ = try? lockbox(["lock", "--all"], tpm: nil) }
        // An item's attributes are printed one per line, control characters escaped: a stored
        // name cannot fake a line or drive the terminal.
        let hostile = "svc\u{1B}[31mRED\r\nclass: fake\u{202E}\u{9B}"
        #expect(try lockbox(["add-generic-password", "-s", hostile, "-a", "a"], input: Array("v\n".utf8), tpm: nil).status == 0)
        let dumped = try lockbox(["dump"], tpm: nil)
        #expect(dumped.status == 0, "\(dumped.standardError)")
        #expect(dumped.standardOutput.contains("service: svc\\x1B[31mRED\\x0D\\x0Aclass: fake\\u{202E}\\x9B"), "\(dumped.standardOutput)")
        #expect(!dumped.standardOutputBytes.contains(0x1B) && !dumped.standardOutput.contains("\u{202E}"))
        #expect(dumped.standardOutput.components(separatedBy: "class: fake").count == 2)
        // An empty --purpose (an unset variable) is a usage error, not every purpose.
        let empty = try lockbox(["generate-key", "--tag", "p", "--purpose", ""], tpm: nil)
        #expect(empty.status == 64 && empty.standardError.contains("--purpose"), "\(empty.status): \(empty.standardError)")
        #expect(try lockbox(["generate-key", "--tag", "p", "--purpose", "sign,"], tpm: nil).status == 64)
        // Two keys with one tag, one without a label: named apart, deleted only one at a time or with --all.
        #expect(try lockbox(["generate-key", "--tag", "amb", "--algorithm", "ed25519"], tpm: nil).status == 0)
        #expect(try lockbox(["generate-key", "--tag", "amb", "--algorithm", "ed25519", "--label", "L2"], tpm: nil).status == 0)
        let both = try lockbox(["delete-key", "--tag", "amb"], tpm: nil)
        #expect(both.status != 0 && both.standardError.contains("--all") && both.standardError.contains("nothing was deleted"), "\(both.standardError)")
        let unlabelled = try lockbox(["public-key", "--tag", "amb", "--label", ""], tpm: nil)
        #expect(unlabelled.status == 0 && unlabelled.standardOutput.hasPrefix("-----BEGIN PUBLIC KEY-----"), "\(unlabelled.standardError)")
        #expect(try lockbox(["delete-key", "--tag", "amb", "--label", ""], tpm: nil).status == 0)
        #expect(try lockbox(["public-key", "--tag", "amb"], tpm: nil).status == 0, "the labelled key was deleted too")
        #expect(try lockbox(["generate-key", "--tag", "amb", "--algorithm", "ed25519", "--label", "L3"], tpm: nil).status == 0)
        let all = try lockbox(["delete-key", "--tag", "amb", "--all"], tpm: nil)
        #expect(all.status == 0 && all.standardError.contains("Deleted 2 keys"), "\(all.standardError)")
        // An agent key's comment is one line: refused with a newline, escaped when a label has one.
        let injected = "laptop\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAttacker attacker"
        let refused = try lockbox(["ssh-agent", "generate", "--type", "ed25519", "--comment", injected], tpm: nil)
        #expect(refused.status == 64 && refused.standardError.contains("control character"), "\(refused.standardError)")
        let reversed = try lockbox(["ssh-agent", "generate", "--type", "ed25519", "--comment", "laptop\u{202E}"], tpm: nil)
        #expect(reversed.status == 64 && reversed.standardError.contains("control character"), "\(reversed.standardError)")
        let canary = makeCanary("stray")
        let stray = try lockbox(["ssh-agent", "generate", "--type", "ed25519", canary], tpm: nil)
        #expect(stray.status == 64 && !stray.standardError.contains(canary) && stray.standardError.contains("not shown"), "\(stray.standardError)")
        let labelled = try lockbox(
            ["generate-key", "--tag", "org.lockbox.ssh-agent", "--algorithm", "ed25519", "--purpose", "sign,verify", "--label", injected,
             "--accessibility", "afterFirstUnlock"], tpm: nil)
        #expect(labelled.status == 0, "\(labelled.standardError)")
        #expect(try lockbox(["ssh-agent", "generate", "--type", "ed25519", "--comment", "closed"], tpm: nil).status == 0)
        let listed = try lockbox(["ssh-agent", "list"], tpm: nil)
        #expect(listed.status == 0, "\(listed.standardError)")
        let lines = listed.standardOutput.split(separator: "\n")
        #expect(lines.count == 2 && lines.allSatisfy { $0.hasPrefix("ssh-ed25519 ") }, "\(listed.standardOutput)")
        #expect(listed.standardOutput.contains("laptop\\x0Assh-ed25519"), "\(listed.standardOutput)")
        // Locked: the open key is listed, the other is said to be left out, and the listing fails.
        #expect(try lockbox(["lock"], tpm: nil).status == 0)
        let partial = try lockbox(["ssh-agent", "list"], tpm: nil)
        #expect(partial.status != 0 && partial.standardError.contains("1 of its agent keys is not listed"), "\(partial.status): \(partial.standardError)")
        #expect(partial.standardOutput.split(separator: "\n").count == 1, "\(partial.standardOutput)")
        let dump = try lockbox(["dump"], tpm: nil)
        #expect(dump.status != 0 && dump.standardError.contains("not shown above") && dump.standardError.contains("-25308"), "\(dump.standardError)")
        #expect(dump.standardOutput.contains("org.lockbox.ssh-agent"), "\(dump.standardOutput)")
        // The open key signs while locked.
        let signed = try lockbox(["sign", "--tag", "org.lockbox.ssh-agent", "--label", injected], input: Array("m".utf8), tpm: nil)
        #expect(signed.status == 0, "\(signed.status): \(signed.standardError)")
    }

    @Test func tpmUnlock_enrollLockUnlockWithoutPassphraseUnenroll() throws {
        let tpm = try PrivateTPM()
        #expect(try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], input: Self.passphrase, tpm: tpm).status == 0)
        defer { _ = try? lockbox(["lock", "--all"], tpm: tpm) }
        let canary = makeCanary("tpm-unlock")
        #expect(try lockbox(["add-generic-password", "-s", "svc", "-a", "acct"], input: Array(canary.utf8), tpm: tpm).status == 0)
        // Without a slot, --tpm2 says so and changes nothing.
        #expect(try lockbox(["unlock", "--tpm2"], tpm: tpm).standardError.contains("no tpm2 unlock method"))

        let enrolled = try lockbox(["enroll", "tpm2", "--pcrs", "7"], tpm: tpm)
        #expect(enrolled.status == 0, "enroll failed: \(enrolled.standardError)")
        #expect(try lockbox(["status"], tpm: tpm).standardOutput.contains("unlock method tpm2"))
        #expect(try lockbox(["lock"], tpm: tpm).status == 0)
        #expect(try lockbox(["find-generic-password", "-s", "svc", "-a", "acct", "-w"], tpm: tpm).status != 0)
        let unlocked = try lockbox(["unlock", "--tpm2"], tpm: tpm)
        #expect(unlocked.status == 0, "unlock --tpm2 failed: \(unlocked.standardError)")
        #expect(try lockbox(["find-generic-password", "-s", "svc", "-a", "acct", "-w"], tpm: tpm).standardOutput == canary + "\n")
        #expect(!filesContaining(canary, in: directory.path).contains { !$0.hasSuffix(".log") })

        #expect(try lockbox(["unenroll", "tpm2"], tpm: tpm).status == 0)
        #expect(try lockbox(["lock"], tpm: tpm).status == 0)
        #expect(try lockbox(["unlock", "--tpm2"], tpm: tpm).status != 0)
    }

    @Test func badInput_clearErrorsAndNothingStored() throws {
        let tpm = try PrivateTPM()
        #expect(try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], input: Self.passphrase, tpm: tpm).status == 0)
        defer { _ = try? lockbox(["lock", "--all"], tpm: tpm) }
        let unknown = try lockbox(["generate-key", "--tag", "x", "--algorithm", "rsa4096"], tpm: tpm)
        #expect(unknown.status == 1)
        #expect(unknown.standardError.contains("Unknown key algorithm") && unknown.standardError.contains("-50"))
        let wrongPurpose = try lockbox(["generate-key", "--tag", "x", "--algorithm", "x25519", "--purpose", "sign"], tpm: tpm)
        #expect(wrongPurpose.standardError.contains("-50"))
        let agreement = try lockbox(["generate-key", "--tag", "agree", "--algorithm", "x25519"], tpm: tpm)
        #expect(agreement.status == 0)
        let signWithAgreement = try lockbox(["sign", "--tag", "agree"], input: Array("m".utf8), tpm: tpm)
        #expect(signWithAgreement.standardError.contains("-67731"))
        let noTPM = try lockbox(["generate-key", "--tag", "hw", "--hardware"], tpm: nil, device: "device:/nonexistent/tpmrm9")
        #expect(noTPM.status == 1)
        #expect(noTPM.standardError.contains("-25291") && noTPM.standardError.contains("never falls back"), "\(noTPM.standardError)")
        let dump = try lockbox(["dump"], tpm: tpm)
        #expect(dump.standardOutput.components(separatedBy: "class: key").count == 2, "only the x25519 key is stored")
        #expect(try lockbox(["lock"], tpm: tpm).status == 0)
        let locked = try lockbox(["public-key", "--tag", "agree"], tpm: tpm)
        #expect(locked.standardError.contains("-25308"))
    }
    /// The device key sealed by the TPM through the CLI; the static `lockbox` (which loads the
    /// tss2 libraries only for this) reads a ThisDeviceOnly item with it, and a copy of the
    /// state directory on another TPM, or with no TPM, reads none of them.
    @Test func sealedDeviceKey_staticLockboxReadsThisDeviceOnly_andNoOtherTPMDoes() throws {
        let tpm = try PrivateTPM()
        #expect(try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], input: Self.passphrase, tpm: tpm).status == 0)
        defer { _ = try? lockbox(["lock", "--all"], tpm: tpm) }
        let canary = makeCanary("device-key")
        let added = try lockbox(
            ["add-generic-password", "-s", "local", "-a", "acct", "--accessibility", "whenUnlockedThisDeviceOnly"], input: Array(canary.utf8),
            tpm: tpm)
        #expect(added.status == 0, "\(added.standardError)")
        #expect(try lockbox(["add-generic-password", "-s", "portable", "-a", "acct"], input: Array("p".utf8), tpm: tpm).status == 0)
        #expect(try lockbox(["status"], tpm: tpm).standardOutput.contains("device key: file (not hardware-bound)"))

        let sealed = try lockbox(["enroll", "tpm2", "--device-key"], tpm: tpm)
        #expect(sealed.status == 0, "\(sealed.standardError)")
        #expect(sealed.standardError.contains("clear key file was replaced"))
        let status = try lockbox(["status"], tpm: tpm)
        #expect(status.standardOutput.contains("device key: sealed by the TPM ("), "\(status.standardOutput)")
        #expect(try lockbox(["status", "--json"], tpm: tpm).standardOutput.contains("\"deviceKey\""))
        let read = try lockbox(["find-generic-password", "-s", "local", "-a", "acct", "-w"], tpm: tpm)
        #expect(read.standardOutput == canary + "\n", "\(read.standardError)")
        #expect(!filesContaining(canary, in: directory.path).contains { !$0.hasSuffix(".log") })

        // Another machine: the same files, another TPM.
        let other = try PrivateTPM()
        #expect(try lockbox(["lock", "--all"], tpm: tpm).status == 0)
        #expect(try lockbox(["unlock", "--passphrase-stdin"], input: Self.passphrase, tpm: other).status == 0)
        #expect(try lockbox(["find-generic-password", "-s", "portable", "-a", "acct", "-w"], tpm: other).standardOutput == "p\n")
        #expect(try lockbox(["status"], tpm: other).standardOutput.contains("not available here, ThisDeviceOnly items cannot be read (OSStatus -25293)"))
        let refused = try lockbox(["find-generic-password", "-s", "local", "-a", "acct", "-w"], tpm: other)
        #expect(refused.status == 1 && refused.standardError.contains("-25293"), "\(refused.standardError)")
        #expect(refused.standardError.contains("does not unseal it here") && !refused.standardOutput.contains(canary))

        // No TPM at all: a clear error naming it, and the sealed file is left as it is.
        let missing = "device:/nonexistent/tpmrm9"
        let noTPM = try lockbox(["find-generic-password", "-s", "local", "-a", "acct", "-w"], tpm: nil, device: missing)
        #expect(noTPM.status == 1 && noTPM.standardError.contains("-25291") && noTPM.standardError.contains("tpmrm9"), "\(noTPM.standardError)")
        let noTPMStatus = try lockbox(["status"], tpm: nil, device: missing).standardOutput
        #expect(noTPMStatus.contains("device key: sealed by the TPM") && noTPMStatus.contains("(OSStatus -25291)"), "\(noTPMStatus)")
    }
}
