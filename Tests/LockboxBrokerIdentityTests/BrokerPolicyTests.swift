import Foundation
import LockboxBrokerIdentity
import LockboxCore
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

func executable(_ path: String, sha256: String? = nil) -> PeerIdentity {
    PeerIdentity(uid: geteuid(), pid: 1, kind: .executable(path: path), executablePath: path, executableSHA256: sha256, startTime: 1)
}

/// A policy directory (`lockbox`, 0700) in a fresh temporary directory.
final class PolicyDirectory {
    let parent = TemporaryDirectory("lockbox-policy")
    var path: String { parent.file("lockbox") }
    var file: String { path + "/" + BrokerPolicy.fileName }

    init() { mkdir(parent.file("lockbox"), 0o700) }

    /// Writes the policy file in place (mode 0600).
    func write(_ text: String) throws {
        try text.write(toFile: file, atomically: false, encoding: .utf8)
        chmod(file, 0o600)
    }

    /// Writes a new file beside it and renames it over the policy, as editors save.
    func replaceAtomically(_ text: String) throws {
        let temporary = path + "/.broker.conf.new"
        try text.write(toFile: temporary, atomically: false, encoding: .utf8)
        chmod(temporary, 0o600)
        #expect(rename(temporary, file) == 0)
    }
}

@Suite struct BrokerPolicyTests {
    static let policy = """
        # Mail and its helper share one group.
        [app org.example.Mail]
        access-groups = org.example.shared, org.example.mail

        [unit backup.service]
        access-groups = backups
        access-groups = org.example.shared

        ; pinned
        [executable /usr/local/bin/sync-tool]
        access-groups = sync
        executable-sha256 = \(String(repeating: "AB", count: 32))

        [lockbox]
        executable = /usr/local/bin/lockbox
        """

    @Test func missingDirectory_isTheEmptyPolicy_andEachIdentityGetsItsOwnGroup() throws {
        let directory = PolicyDirectory()
        let policy = try BrokerPolicy.load(directory: directory.parent.file("absent"))
        let grant = policy.grant(for: executable("/usr/bin/app"))
        #expect(grant.accessGroups == ["exe:/usr/bin/app"])
        #expect(grant.defaultAccessGroup == "exe:/usr/bin/app")
        #expect(!grant.isLockboxCommand)
        try grant.check(group: "exe:/usr/bin/app")
    }

    @Test func entries_grantTheirGroupsThenTheirOwn() throws {
        let directory = PolicyDirectory()
        try directory.write(Self.policy)
        let policy = try BrokerPolicy.load(directory: directory.path)
        #expect(policy.path == directory.file)
        #expect(policy.pinsExecutableHashes)
        #expect(policy.lockboxExecutables == ["/usr/local/bin/lockbox"])

        let mail = PeerIdentity(uid: geteuid(), pid: 1, kind: .flatpak(appID: "org.example.Mail"), executablePath: "/app/bin/mail", executableSHA256: nil, startTime: 1)
        #expect(policy.grant(for: mail).accessGroups == ["org.example.shared", "org.example.mail", "org.example.Mail"])
        #expect(policy.grant(for: mail).defaultAccessGroup == "org.example.shared")
        let backup = PeerIdentity(uid: geteuid(), pid: 1, kind: .systemdUnit("backup.service"), executablePath: "/usr/bin/restic", executableSHA256: nil, startTime: 1)
        #expect(policy.grant(for: backup).accessGroups == ["backups", "org.example.shared", "unit:backup.service"])
        // A unit's entry is not an executable's, and an app id is not a unit.
        #expect(policy.grant(for: executable("/usr/bin/restic")).accessGroups == ["exe:/usr/bin/restic"])
    }

    @Test func groupNotHeld_isMissingEntitlement_withTheLineThatGrantsIt() throws {
        let directory = PolicyDirectory()
        try directory.write(Self.policy)
        let grant = try BrokerPolicy.load(directory: directory.path).grant(for: executable("/usr/bin/app"))

        let error = #expect(throws: LockboxError.self) { try grant.check(group: "org.example.shared") }
        #expect(error?.code == .missingEntitlement)
        #expect(error?.status == -34018)
        #expect(error?.message.contains(directory.file) == true)
        #expect(error?.message.contains("[executable /usr/bin/app] then access-groups = org.example.shared") == true)
    }

    @Test func pinnedExecutable_getsItsGroupsOnlyWithTheRightDigest() throws {
        let directory = PolicyDirectory()
        try directory.write(Self.policy)
        let policy = try BrokerPolicy.load(directory: directory.path)
        let pin = String(repeating: "ab", count: 32)

        #expect(policy.grant(for: executable("/usr/local/bin/sync-tool", sha256: pin)).accessGroups == ["sync", "exe:/usr/local/bin/sync-tool"])
        let impostor = policy.grant(for: executable("/usr/local/bin/sync-tool", sha256: String(repeating: "cd", count: 32)))
        #expect(impostor.accessGroups.isEmpty)
        #expect(impostor.defaultAccessGroup == nil)
        let error = #expect(throws: LockboxError.self) { try impostor.check(group: "exe:/usr/local/bin/sync-tool") }
        #expect(error?.code == .missingEntitlement)
        #expect(error?.message.contains("sha256sum '/usr/local/bin/sync-tool'") == true)
        #expect(policy.grant(for: executable("/usr/local/bin/sync-tool")).refusal?.contains("hashExecutable") == true)
    }

    @Test func lockboxCommand_reachesEveryGroupOnlyAfterThePassphrase() throws {
        let directory = PolicyDirectory()
        try directory.write(Self.policy)
        let grant = try BrokerPolicy.load(directory: directory.path).grant(for: executable("/usr/local/bin/lockbox"))
        #expect(grant.isLockboxCommand)
        try grant.check(group: "org.example.mail", passphraseReentered: true)
        let error = #expect(throws: LockboxError.self) { try grant.check(group: "org.example.mail") }
        #expect(error?.code == .missingEntitlement)
        #expect(error?.message.contains("passphrase is entered again") == true)
        // A unit's process whose path the broker could not confirm (a bind mount in a namespace
        // of its own puts any program there) is not the lockbox command.
        let policy = try BrokerPolicy.load(directory: directory.path)
        let unit = { (confirmed: Bool) in
            PeerIdentity(
                uid: geteuid(), pid: 1, kind: .systemdUnit("evil.service"), executablePath: "/usr/local/bin/lockbox", executableSHA256: nil,
                startTime: 1, executableIsAtPath: confirmed)
        }
        #expect(!policy.grant(for: unit(false)).isLockboxCommand)
        #expect(policy.grant(for: unit(true)).isLockboxCommand)
        // Without a [lockbox] section, the lockbox beside this process is the one.
        let defaults = try BrokerPolicy(parsing: "", path: "memory")
        #expect(defaults.lockboxExecutables == [realPath("/proc/self/exe").split(separator: "/").dropLast().map { "/" + $0 }.joined() + "/lockbox"])
    }

    @Test(arguments: [
        ("[app org.example.Mail]\naccess-groups org.example.shared\n", "line 2"),
        ("access-groups = a\n", "outside any section"),
        ("[app noDots]\n", "not a Flatpak app id"),
        ("[unit backup.timer]\n", "not a systemd service name"),
        ("[executable relative/path]\n", "absolute path"),
        ("[executable /a]\n[executable /a]\n", "appears twice"),
        ("[executable /a]\nexecutable-sha256 = 1234\n", "64 hexadecimal digits"),
        ("[executable /a]\ncolour = blue\n", "not a key of this section"),
        ("[executable /a]\naccess-groups =\n", "names no group"),
        ("[group x]\n", "a section is"),
        ("[app org.example.Mail\n", "ends with ]"),
    ])
    func malformedFile_isAParamErrorNamingTheLine(text: String, expected: String) throws {
        let directory = PolicyDirectory()
        try directory.write(text)
        let error = #expect(throws: LockboxError.self) { try BrokerPolicy.load(directory: directory.path) }
        #expect(error?.code == .param)
        #expect(error?.message.contains(expected) == true, "\(error?.message ?? "")")
        #expect(error?.message.contains(directory.file + ", line") == true)
    }

    @Test func fileWritableByGroup_isRefusedWithTheChmod() throws {
        let directory = PolicyDirectory()
        try directory.write(Self.policy)
        chmod(directory.file, 0o620)
        let error = #expect(throws: LockboxError.self) { try BrokerPolicy.load(directory: directory.path) }
        #expect(error?.code == .io)
        #expect(error?.message.contains("chmod go-w '\(directory.file)'") == true)
        // Readable by others is fine: the policy is no secret.
        chmod(directory.file, 0o644)
        #expect(try BrokerPolicy.load(directory: directory.path).entries.count == 3)
    }

    @Test func directoryWritableByGroup_isRefused() throws {
        let directory = PolicyDirectory()
        try directory.write(Self.policy)
        chmod(directory.path, 0o770)
        let error = #expect(throws: LockboxError.self) { try BrokerPolicy.load(directory: directory.path) }
        #expect(error?.code == .io)
        #expect(error?.message.contains("chmod go-w '\(directory.path)'") == true)
    }

    @Test(.enabled(if: geteuid() == 0, "needs root to give a file to another user"))
    func fileOrDirectoryOfAnotherUser_isRefused() throws {
        let directory = PolicyDirectory()
        try directory.write(Self.policy)
        #expect(chown(directory.file, 65534, 65534) == 0)
        let fileError = #expect(throws: LockboxError.self) { try BrokerPolicy.load(directory: directory.path) }
        #expect(fileError?.message.contains("belongs to another user (uid 65534)") == true)
        #expect(chown(directory.file, 0, 0) == 0)
        #expect(chown(directory.path, 65534, 65534) == 0)
        let directoryError = #expect(throws: LockboxError.self) { try BrokerPolicy.load(directory: directory.path) }
        #expect(directoryError?.code == .io)
        #expect(directoryError?.message.contains(directory.path) == true)
    }

    @Test func policyThatIsASymbolicLink_isRefused_evenToAFileOfTheUser() throws {
        let directory = PolicyDirectory()
        let elsewhere = directory.parent.file("elsewhere.conf")
        try Self.policy.write(toFile: elsewhere, atomically: false, encoding: .utf8)
        chmod(elsewhere, 0o600)
        #expect(symlink(elsewhere, directory.file) == 0)
        let error = #expect(throws: LockboxError.self) { try BrokerPolicy.load(directory: directory.path) }
        #expect(error?.code == .io)
        #expect(error?.message.contains("symbolic link") == true)

        // The directory itself as a link is refused too.
        let linkedDirectory = directory.parent.file("linked")
        #expect(symlink(directory.path, linkedDirectory) == 0)
        #expect(throws: LockboxError.self) { try BrokerPolicy.load(directory: linkedDirectory) }
    }

    @Test func notUTF8_isAParamError() throws {
        let directory = PolicyDirectory()
        #expect(FileManager.default.createFile(atPath: directory.file, contents: Data([0x5b, 0xff, 0xfe, 0x5d]), attributes: [.posixPermissions: 0o600]))
        let error = #expect(throws: LockboxError.self) { try BrokerPolicy.load(directory: directory.path) }
        #expect(error?.code == .param)
    }
}

@Suite struct BrokerPolicyWatcherTests {
    let app = executable("/usr/bin/app")

    @Test func atomicReplace_isReadAgain() throws {
        let directory = PolicyDirectory()
        try directory.write("[executable /usr/bin/app]\naccess-groups = first\n")
        let watcher = BrokerPolicyWatcher(directory: directory.path)
        #expect(try watcher.current().grant(for: app).accessGroups == ["first", "exe:/usr/bin/app"])
        #expect(try watcher.current().grant(for: app).accessGroups == ["first", "exe:/usr/bin/app"])

        try directory.replaceAtomically("[executable /usr/bin/app]\naccess-groups = second\n")
        #expect(try watcher.current().grant(for: app).accessGroups == ["second", "exe:/usr/bin/app"])
    }

    @Test func editInPlace_ofTheSameSize_isReadAgain() throws {
        let directory = PolicyDirectory()
        try directory.write("[executable /usr/bin/app]\naccess-groups = aaaa\n")
        let watcher = BrokerPolicyWatcher(directory: directory.path)
        #expect(try watcher.current().grant(for: app).defaultAccessGroup == "aaaa")
        try directory.write("[executable /usr/bin/app]\naccess-groups = bbbb\n")
        #expect(try watcher.current().grant(for: app).defaultAccessGroup == "bbbb")
    }

    @Test func fileSwappedForASymbolicLink_isAnError_notTheLastGoodPolicy() throws {
        let directory = PolicyDirectory()
        try directory.write("[executable /usr/bin/app]\naccess-groups = first\n")
        let watcher = BrokerPolicyWatcher(directory: directory.path)
        _ = try watcher.current()

        let planted = directory.parent.file("planted.conf")
        try "[executable /usr/bin/app]\naccess-groups = everything\n".write(toFile: planted, atomically: false, encoding: .utf8)
        chmod(planted, 0o600)
        let link = directory.path + "/.swap"
        #expect(symlink(planted, link) == 0)
        #expect(rename(link, directory.file) == 0)
        let error = #expect(throws: LockboxError.self) { try watcher.current() }
        #expect(error?.message.contains("symbolic link") == true)
    }

    @Test func fileThatBecomesMalformedOrGroupWritable_isAnError_untilFixed() throws {
        let directory = PolicyDirectory()
        try directory.write("[executable /usr/bin/app]\naccess-groups = first\n")
        let watcher = BrokerPolicyWatcher(directory: directory.path)
        _ = try watcher.current()

        try directory.replaceAtomically("[executable /usr/bin/app\n")
        #expect(throws: LockboxError.self) { try watcher.current() }
        try directory.replaceAtomically("[executable /usr/bin/app]\naccess-groups = fixed\n")
        #expect(try watcher.current().grant(for: app).defaultAccessGroup == "fixed")

        chmod(directory.file, 0o666)
        #expect(throws: LockboxError.self) { try watcher.current() }
        chmod(directory.file, 0o600)
        chmod(directory.path, 0o777)
        #expect(throws: LockboxError.self) { try watcher.current() }
    }

    @Test func policyRemoved_isTheEmptyPolicy() throws {
        let directory = PolicyDirectory()
        try directory.write("[executable /usr/bin/app]\naccess-groups = first\n")
        let watcher = BrokerPolicyWatcher(directory: directory.path)
        _ = try watcher.current()
        #expect(unlink(directory.file) == 0)
        #expect(try watcher.current().grant(for: app).accessGroups == ["exe:/usr/bin/app"])
    }
}

@Suite struct SHA256Tests {
    @Test(arguments: [
        ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        ("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    ])
    func knownAnswers(message: String, digest: String) {
        var hash = SHA256()
        hash.update(Array(message.utf8))
        #expect(hash.finalizeHex() == digest)
    }

    @Test func millionAs_fedInUnevenPieces() {
        var hash = SHA256()
        var remaining = 1_000_000
        var piece = 1
        while remaining > 0 {
            let count = min(piece, remaining)
            hash.update([UInt8](repeating: UInt8(ascii: "a"), count: count))
            remaining -= count
            piece = piece * 3 % 997 + 1
        }
        #expect(hash.finalizeHex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }
}

@Suite struct BrokerPolicyParserRobustnessTests {
    /// Random mutations of a valid policy either parse or fail as errSecParam naming a line;
    /// nothing else (no crash, no other code).
    @Test func mutatedPolicies_parseOrFailWithALineNumber() {
        var random = SeededGenerator("mutatedPolicies")
        let base = Array(BrokerPolicyTests.policy.utf8)
        let alphabet = Array("[]=#;,: \t\n\r/.-_abcAB09é\u{0}".utf8)
        for _ in 0..<2000 {
            var bytes = base
            for _ in 0..<Int.random(in: 1...8, using: &random) {
                let position = Int.random(in: 0..<bytes.count, using: &random)
                switch Int.random(in: 0..<3, using: &random) {
                case 0: bytes[position] = alphabet.randomElement(using: &random)!
                case 1: bytes.insert(alphabet.randomElement(using: &random)!, at: position)
                default: if bytes.count > 1 { bytes.remove(at: position) }
                }
            }
            let text = String(decoding: bytes, as: UTF8.self)
            do {
                let policy = try BrokerPolicy(parsing: text, path: "mutated.conf")
                #expect(policy.entries.allSatisfy { $0.executableSHA256.map { $0.utf8.count == 64 } ?? true }, "seed \(random.seed)")
            } catch {
                #expect(error.code == .param, "seed \(random.seed)")
                #expect(error.message.hasPrefix("mutated.conf, line "), "seed \(random.seed): \(error.message)")
            }
        }
    }
}
