import Foundation
import Glibc
import Lockbox
import LockboxTestSupport
import Synchronization
import Testing
import VaultStorage

@testable import LockboxVault

/// The file-system attacker: planted symlinks, shared directories, and a path that changes
/// between Lockbox's checks and SQLite's open.
@Suite("Files: planted links, shared directories, rename races", .serialized)
struct FileRaceTests {
    @Test("a keychain in a sticky shared directory is refused with advice that names a private directory, never a chmod of it")
    func stickySharedDirectory_adviceNamesPrivateDirectory() throws {
        let shared = TemporaryDirectory("lockbox-sticky")
        #expect(chmod(shared.path, 0o1777) == 0)
        do {
            _ = try Vault.create(at: shared.file("x.lockbox"), passphrase: SecretBytes(utf8: "p"))
            Issue.record("a vault was created in a shared directory")
        } catch {
            #expect(error.message.contains("private directory"))
            #expect(!error.message.contains("chmod 700 '\(shared.path)'"))
        }
    }

    @Test("a symlink planted where the keychain file should be is refused")
    func plantedSymlink_isRefused() throws {
        let fixture = try VaultFixture()
        let other = TemporaryDirectory("lockbox-link-target")
        let link = fixture.directory.file("keychains/linked.lockbox")
        #expect(symlink(fixture.path, link) == 0)
        _ = other
        #expect(status { _ = try Vault.open(at: link) } == -36)
    }

    @Test("a keychain file with a second name (a hard link) is refused by either name, nothing lost, and opens once the other name is gone")
    func hardLinkedKeychain_isRefused() throws {
        let fixture = try VaultFixture()
        let query = Query.genericPassword(service: "svc", account: "alice")
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "kept")))
        let second = fixture.directory.file("keychains/second.lockbox")
        #expect(link(fixture.path, second) == 0)
        // Each name would get a write-ahead log of its own, and writes through one would be
        // lost to the other: neither name is opened, verified or written.
        for path in [fixture.path, second] {
            do {
                _ = try Vault.open(at: path)
                Issue.record("a keychain with two names was opened by \(path)")
            } catch {
                #expect(error.status == -36)
                #expect(error.message.contains("2 names (hard links)") && error.message.contains("find / -xdev -samefile"), "\(error.message)")
            }
        }
        #expect(status { _ = try Vault.verify(at: second) } == -36)
        #expect(!FileManager.default.fileExists(atPath: second + "-wal"), "a log was made beside the second name")
        #expect(unlink(second) == 0)
        #expect(try fixture.reopen().data(matching: query) == SecretBytes(utf8: "kept"))
        #expect(try Vault.verify(at: fixture.path).isSound)
    }

    @Test("a keychain in a directory this user may not enter is said to be out of reach, never 'no keychain' (exit 44)")
    func unreachableKeychain_isNotMissing() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "kept")))
        let arguments = ["--keychain", fixture.path, "find-generic-password", "-s", "svc", "-a", "alice", "-w"]
        let result: ProcessResult
        if getuid() == 0 {
            // Root enters any directory: the program runs as the user nobody instead.
            result = try run(
                "/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "--", builtProduct("lockbox")] + arguments,
                environment: ["PATH": "/usr/bin:/bin", "HOME": "/nonexistent"])
        } else {
            let directory = FilePermissions.directory(of: fixture.path)
            #expect(chmod(directory, 0) == 0)
            defer { chmod(directory, 0o700) }
            result = try run(builtProduct("lockbox"), arguments)
        }
        #expect(result.status != 0 && result.status != 44, "\(result.status): \(result.standardError)")
        #expect(result.standardError.contains("Cannot reach") && result.standardError.contains("Permission denied"), "\(result.standardError)")
        #expect(!result.standardError.contains("No keychain") && !result.standardOutput.contains("kept"))
    }

    @Test("root with another user's environment (sudo -E) is told the directory is that user's, not advised to make a directory in it")
    func anotherUsersPrivateDirectory_saysWhose() throws {
        try #require(getuid() == 0, "this test makes a directory of another user's (nobody), which needs root")
        let base = TemporaryDirectory("lockbox-other-user")
        let theirs = base.file("theirs")
        #expect(mkdir(theirs, 0o700) == 0)
        let path = theirs + "/default.lockbox"
        try Vault.create(at: path, passphrase: SecretBytes(utf8: "theirs")).lockAll()
        #expect(chown(path, 65534, 65534) == 0 && chown(theirs, 65534, 65534) == 0)
        do {
            _ = try Vault.open(at: path)
            Issue.record("another user's directory was used")
        } catch {
            #expect(error.message.contains("belongs to another user (uid 65534)") && error.message.contains("Run it as that user"), "\(error.message)")
            #expect(!error.message.contains("mkdir"))
        }
    }

    @Test("SQLite's own descriptor is what the open is checked against")
    func sqliteDescriptor_isTheCheckedFile() throws {
        let fixture = try VaultFixture()
        let database = try Database(path: fixture.path, create: false)
        var info = stat()
        #expect(stat(fixture.path, &info) == 0)
        let opened = try #require(database.openedFileIdentity)
        #expect(opened.device == UInt64(info.st_dev) && opened.inode == UInt64(info.st_ino))
    }

    @Test("a path flipped between two keychains while opening never opens the one that failed the checks")
    func renameRace_neverOpensTheUncheckedFile() throws {
        let root = TemporaryDirectory("lockbox-race")
        let genuine = root.file("genuine")
        let foreign = root.file("foreign")
        for directory in [genuine, foreign] {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
        var configuration = Vault.Configuration()
        configuration.keyDerivation = .interactive
        configuration.unlockCache = .processMemory
        let mine = try Vault.create(at: genuine + "/v.lockbox", passphrase: SecretBytes(utf8: "mine"), configuration: configuration)
        let theirs = try Vault.create(at: foreign + "/v.lockbox", passphrase: SecretBytes(utf8: "theirs"), configuration: configuration)
        let theirIdentifier = theirs.identifier
        _ = mine
        // The foreign file belongs to another user: the checks refuse it, SQLite (as root) would not.
        #expect(chown(foreign + "/v.lockbox", 65534, 65534) == 0)
        let link = root.file("current")
        #expect(symlink(genuine, link) == 0)
        let stop = Atomic(false)
        let flipper = Thread {
            var flip = false
            while !stop.load(ordering: .relaxed) {
                let staging = root.file("staging")
                unlink(staging)
                symlink(flip ? genuine : foreign, staging)
                rename(staging, link)
                flip.toggle()
            }
        }
        flipper.start()
        var opened = 0
        var wrong = 0
        for _ in 0..<300 {
            if let vault = try? Vault.open(at: link + "/v.lockbox", configuration: configuration) {
                opened += 1
                if vault.identifier == theirIdentifier { wrong += 1 }
            }
        }
        stop.store(true, ordering: .relaxed)
        #expect(wrong == 0, "the unchecked file was opened \(wrong) times")
        #expect(opened > 0)
    }
}
