import Foundation
import Lockbox
import LockboxKeys
import LockboxSSHAgent
import LockboxTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Real OpenSSH against `lockbox-ssh-agent`: ssh-add, ssh into a local sshd, ssh-keygen -Y,
/// and a git commit signed through the agent.
@Suite("SSH agent with OpenSSH and git", .serialized)
struct OpenSSHTests {
    @Test("ssh-add -L lists the agent's Ed25519 and P-256 keys, and only them, through `lockbox ssh-agent`")
    func sshAddList_showsTheAgentKeysOnly() throws {
        let fixture = try AgentFixture()
        let ed25519 = try fixture.generate(.ed25519, comment: "ed@lockbox")
        let p256 = try fixture.generate(.p256, comment: "ec@lockbox")
        // Not the agent's: no agent tag, or no sign purpose.
        var other = KeySpecification(algorithm: .ed25519, purposes: [.sign])
        other.applicationTag = Data("org.example.other".utf8)
        _ = try fixture.keys.generate(other)
        try fixture.generate(.ed25519, comment: "verify-only", purposes: [.verify])
        try fixture.start(throughLockbox: true)

        let list = try fixture.run("ssh-add", ["-L"])
        #expect(list.status == 0, "ssh-add -L: \(list.standardError)\nagent: \(fixture.log())")
        let lines = Set(list.standardOutput.split(separator: "\n").map(String.init))
        #expect(lines == [try ed25519.publicKey!.openSSHRepresentation(comment: "ed@lockbox"), try p256.publicKey!.openSSHRepresentation(comment: "ec@lockbox")])

        let socketDirectory = (fixture.socket as NSString).deletingLastPathComponent
        #expect(try permissions(socketDirectory) == 0o700)
        #expect(try permissions(fixture.socket) == 0o600)
    }

    @Test("`lockbox ssh-agent generate` makes a non-extractable agent key and prints its line; list prints it; an RSA type is a usage error")
    func generateAndList_throughLockbox() throws {
        let fixture = try AgentFixture()
        let lockbox = builtProduct("lockbox")
        let generated = try run(lockbox, ["--keychain", fixture.vault.path, "ssh-agent", "generate", "--type", "ecdsa", "--comment", "made@cli"], timeout: 60)
        #expect(generated.status == 0, "generate: \(generated.standardError)")
        #expect(generated.standardOutput.hasPrefix("ecdsa-sha2-nistp256 AAAA") && generated.standardOutput.hasSuffix(" made@cli\n"))
        let keys = try fixture.keys.keys(applicationTag: ManagedKeySource.applicationTag)
        #expect(keys.count == 1 && keys.first?.isExtractable == false)
        let list = try run(lockbox, ["--keychain", fixture.vault.path, "ssh-agent", "list"], timeout: 60)
        #expect(list.status == 0 && list.standardOutput == generated.standardOutput)
        let rsa = try run(lockbox, ["--keychain", fixture.vault.path, "ssh-agent", "generate", "--type", "rsa"], timeout: 60)
        #expect(rsa.status == 64)
        #expect(try fixture.keys.keys(applicationTag: ManagedKeySource.applicationTag).count == 1)
    }

    @Test("ssh logs into a local sshd with each key through the agent", arguments: [KeyAlgorithm.ed25519, .p256])
    func ssh_logsInThroughTheAgent(algorithm: KeyAlgorithm) throws {
        let server = try LocalSSHServer.running()
        let fixture = try AgentFixture()
        let comment = "login-\(algorithm)-\(UInt32.random(in: 0...UInt32.max))"
        let key = try fixture.generate(algorithm, comment: comment)
        try server.authorize(try key.publicKey!.openSSHRepresentation(comment: comment))
        try fixture.start()

        let login = try fixture.run("ssh", server.sshArguments("echo logged-in-as-$(id -un)"))
        #expect(login.status == 0, "ssh: \(login.standardError)\nagent: \(fixture.log())")
        #expect(login.standardOutput == "logged-in-as-\(server.user)\n")
    }

    @Test("ssh-keygen -Y sign through the agent, -Y verify accepts it, and rejects a changed file", arguments: [KeyAlgorithm.ed25519, .p256])
    func sshKeygenSign_verifies(algorithm: KeyAlgorithm) throws {
        let fixture = try AgentFixture()
        let key = try fixture.generate(algorithm, comment: "signer")
        try fixture.start()
        let publicLine = try key.publicKey!.openSSHRepresentation(comment: "signer")
        let publicFile = fixture.directory.file("signer.pub")
        let message = fixture.directory.file("message.txt")
        try publicLine.write(toFile: publicFile, atomically: true, encoding: .utf8)
        try "release 1.0\n".write(toFile: message, atomically: true, encoding: .utf8)
        try "signer@example.org \(publicLine)\n".write(toFile: fixture.directory.file("allowed"), atomically: true, encoding: .utf8)

        let sign = try fixture.run("ssh-keygen", ["-Y", "sign", "-f", publicFile, "-n", "file", message])
        #expect(sign.status == 0, "sign: \(sign.standardError)\nagent: \(fixture.log())")
        let verify = try fixture.run(
            "ssh-keygen", ["-Y", "verify", "-f", fixture.directory.file("allowed"), "-I", "signer@example.org", "-n", "file", "-s", message + ".sig"],
            input: "release 1.0\n")
        #expect(verify.status == 0, "verify: \(verify.standardError)")
        let forged = try fixture.run(
            "ssh-keygen", ["-Y", "verify", "-f", fixture.directory.file("allowed"), "-I", "signer@example.org", "-n", "file", "-s", message + ".sig"],
            input: "release 1.1\n")
        #expect(forged.status != 0)
    }

    @Test("git signs a commit with gpg.format=ssh through the agent, and verify-commit accepts it")
    func gitCommit_signedThroughTheAgent() throws {
        let fixture = try AgentFixture()
        let key = try fixture.generate(.ed25519, comment: "git-signing")
        try fixture.start()
        let publicLine = try key.publicKey!.openSSHRepresentation(comment: "git-signing")
        let repository = fixture.directory.file("repository")
        try FileManager.default.createDirectory(atPath: repository, withIntermediateDirectories: true)
        try "dev@example.org \(publicLine)\n".write(toFile: fixture.directory.file("allowed_signers"), atomically: true, encoding: .utf8)
        let git: ([String]) throws -> ProcessResult = { arguments in try fixture.run("git", arguments, directory: repository) }
        #expect(try git(["init", "-q"]).status == 0)
        for (name, value) in [
            ("user.name", "Dev"), ("user.email", "dev@example.org"), ("gpg.format", "ssh"), ("user.signingkey", "key::\(publicLine)"),
            ("gpg.ssh.allowedSignersFile", fixture.directory.file("allowed_signers")), ("commit.gpgsign", "true"),
        ] {
            #expect(try git(["config", name, value]).status == 0)
        }
        try "hello\n".write(toFile: repository + "/README", atomically: true, encoding: .utf8)
        #expect(try git(["add", "README"]).status == 0)
        let commit = try git(["commit", "-q", "-m", "signed through lockbox ssh-agent"])
        #expect(commit.status == 0, "commit: \(commit.standardError)\nagent: \(fixture.log())")
        let verify = try git(["verify-commit", "HEAD"])
        #expect(verify.status == 0, "verify-commit: \(verify.standardError)")
        #expect(verify.standardError.contains("Good \"git\" signature for dev@example.org"))
    }

    @Test("a userPresence key asks through SSH_ASKPASS once within the reuse window, at every use without one, and a cancel signs nothing")
    func userPresenceKey_asksOncePerReuseWindow() throws {
        for (reuse, expectedPrompts) in [("300", 1), ("0", 2)] {
            let fixture = try AgentFixture()
            let key = try fixture.generate(.ed25519, comment: "presence", accessControl: .userPresence)
            let prompts = fixture.directory.file("prompts")
            let askpass = fixture.directory.file("askpass")
            let passphraseFile = fixture.directory.file("passphrase")
            try VaultFixture.passphraseText.write(toFile: passphraseFile, atomically: true, encoding: .utf8)
            try "#!/bin/sh\necho \"$1\" >> '\(prompts)'\ncat '\(passphraseFile)'\n".write(toFile: askpass, atomically: true, encoding: .utf8)
            chmod(askpass, 0o700)
            try fixture.start(arguments: ["--reuse-seconds", reuse], environment: ["SSH_ASKPASS": askpass, "SSH_ASKPASS_REQUIRE": "force"])
            let publicFile = fixture.directory.file("presence.pub")
            try key.publicKey!.openSSHRepresentation(comment: "presence").write(toFile: publicFile, atomically: true, encoding: .utf8)
            for round in 1...2 {
                let message = fixture.directory.file("message-\(round)")
                try "pull \(round)\n".write(toFile: message, atomically: true, encoding: .utf8)
                let sign = try fixture.run("ssh-keygen", ["-Y", "sign", "-f", publicFile, "-n", "git", message])
                #expect(sign.status == 0, "sign \(round): \(sign.standardError)\nagent: \(fixture.log())")
            }
            let asked = (try? String(contentsOfFile: prompts, encoding: .utf8)) ?? ""
            #expect(asked.split(separator: "\n").count == expectedPrompts, "reuse \(reuse): prompts \(asked)")
            // The prompt names the key as OpenSSH does: its comment and its fingerprint.
            let listed = try fixture.run("ssh-keygen", ["-l", "-f", publicFile])
            let fingerprint = listed.standardOutput.split(separator: " ").first(where: { $0.hasPrefix("SHA256:") }).map(String.init) ?? "?"
            #expect(asked.contains("sign with the SSH key presence (\(fingerprint))"), "\(asked) / \(listed.standardOutput)")
            #expect(asked.contains("lets every key sign for 300 s") == (reuse == "300"), "\(asked)")
            #expect(!fixture.log().contains(VaultFixture.passphraseText))
        }

        // The user cancels: the askpass program fails. The agent answers failure.
        let fixture = try AgentFixture()
        let key = try fixture.generate(.p256, comment: "presence", accessControl: .userPresence)
        let askpass = fixture.directory.file("askpass")
        try "#!/bin/sh\nexit 1\n".write(toFile: askpass, atomically: true, encoding: .utf8)
        chmod(askpass, 0o700)
        try fixture.start(environment: ["SSH_ASKPASS": askpass, "SSH_ASKPASS_REQUIRE": "force"])
        let publicFile = fixture.directory.file("presence.pub")
        try key.publicKey!.openSSHRepresentation().write(toFile: publicFile, atomically: true, encoding: .utf8)
        try "x\n".write(toFile: fixture.directory.file("message"), atomically: true, encoding: .utf8)
        let cancelled = try fixture.run("ssh-keygen", ["-Y", "sign", "-f", publicFile, "-n", "git", fixture.directory.file("message")])
        #expect(cancelled.status != 0)
        #expect(!FileManager.default.fileExists(atPath: fixture.directory.file("message.sig")))
        #expect(fixture.log().contains("-128"))
        #expect(try fixture.keys.keys(applicationTag: ManagedKeySource.applicationTag).count == 1)
    }

    @Test("a locked keychain: ssh-add -L and signing fail (never an empty list), and work again after unlock")
    func lockedKeychain_failsThenRecovers() throws {
        let fixture = try AgentFixture()
        let key = try fixture.generate(.ed25519, comment: "locked")
        try fixture.start()
        let publicFile = fixture.directory.file("locked.pub")
        try key.publicKey!.openSSHRepresentation().write(toFile: publicFile, atomically: true, encoding: .utf8)
        try "x\n".write(toFile: fixture.directory.file("message"), atomically: true, encoding: .utf8)

        fixture.vault.vault.lock()
        let list = try fixture.run("ssh-add", ["-L"])
        #expect(list.status != 0)
        #expect(list.standardOutput.isEmpty)
        let sign = try fixture.run("ssh-keygen", ["-Y", "sign", "-f", publicFile, "-n", "file", fixture.directory.file("message")])
        #expect(sign.status != 0)
        #expect(fixture.log().contains("-25308"))

        try fixture.vault.vault.unlock(passphrase: fixture.vault.passphrase)
        let again = try fixture.run("ssh-add", ["-L"])
        #expect(again.status == 0, "after unlock: \(again.standardError)")
        #expect(again.standardOutput.contains(try key.publicKey!.openSSHRepresentation()))
    }

    @Test("ssh-add FILE, ssh-add -d and -D are refused, and the keychain's keys stay as they were")
    func addAndRemove_areRefused() throws {
        let fixture = try AgentFixture()
        try fixture.generate(.ed25519, comment: "kept")
        try fixture.start()
        let file = fixture.directory.file("id_ed25519")
        #expect(try fixture.run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", file]).status == 0)
        #expect(try fixture.run("ssh-add", [file]).status != 0)
        #expect(try fixture.run("ssh-add", ["-D"]).status != 0)
        let list = try fixture.run("ssh-add", ["-L"])
        #expect(list.standardOutput.split(separator: "\n").count == 1)
        #expect(try fixture.keys.keys(applicationTag: ManagedKeySource.applicationTag).count == 1)
    }
}

func permissions(_ path: String) throws -> Int {
    let attributes = try FileManager.default.attributesOfItem(atPath: path)
    return (attributes[.posixPermissions] as? Int ?? -1) & 0o777
}
