import Foundation
import Lockbox
import LockboxTestSupport
import Testing

/// The CLI's defaults that protect what a user stored: deletes that name nothing, exact bytes,
/// secrets typed in the wrong place, empty secrets, and the terminal's prompts.
@Suite("lockbox command line, safe defaults")
struct SafeDefaultsTests {
    let binary = builtProduct("lockbox")
    let directory = TemporaryDirectory("lockbox-safe")
    var keychain: String { directory.file("keychains/safe.lockbox") }
    static let passphrase = "safe passphrase"

    func lockbox(_ arguments: [String], input: [UInt8] = []) throws -> ProcessResult {
        #expect(FileManager.default.isExecutableFile(atPath: binary), "the lockbox binary is not built at \(binary)")
        return try run(binary, ["--keychain", keychain] + arguments, input: input)
    }

    func lockbox(_ arguments: [String], text: String) throws -> ProcessResult {
        try lockbox(arguments, input: Array(text.utf8))
    }

    /// Creates the keychain, unlocked; `lockAll()` forgets its keys (as at reboot).
    func initialize() throws {
        let result = try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], text: Self.passphrase + "\n")
        try #require(result.status == 0, "init failed: \(result.standardError)")
    }

    func lockAll() {
        _ = try? lockbox(["lock", "--all"])
    }

    func secret(_ service: String, _ account: String, raw: Bool = true) throws -> ProcessResult {
        try lockbox(["find-generic-password", "-s", service, "-a", account, "-w"] + (raw ? ["--raw"] : []))
    }

    static let unshare = "/usr/bin/unshare"

    /// `unshare`'s options for a mount namespace of the script's own: `-rm` (a user namespace
    /// too, so no root is needed); as root `-m`. In a chroot (a machine built with debootstrap),
    /// where the root is no mount point and user namespaces are refused, the mounts' propagation
    /// is left as it is, which is safe only when no mount shares its mounts with another
    /// namespace: checked, else the test fails saying so.
    static func namespaceOptions() throws -> [String] {
        guard getuid() == 0 else { return ["-rm"] }
        if try run(unshare, ["-m", "/bin/true"]).status == 0 { return ["-m"] }
        let mounts = try String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)
        guard !mounts.contains(" shared:") else {
            Issue.record("unshare -m fails here (a chroot?) and a mount is shared, so a tmpfs mounted in a namespace would show outside it")
            return ["-m"]
        }
        return ["-m", "--propagation", "unchanged"]
    }

    /// A directory for a script run under `unshare` (``namespaceOptions()``) to mount a 1 MiB
    /// tmpfs on: a mount namespace of its own, so nothing is mounted for other processes.
    func fullDiskMountPoint(_ name: String) throws -> String {
        #expect(FileManager.default.isExecutableFile(atPath: Self.unshare), "unshare (Debian's util-linux) is missing")
        let mountPoint = directory.file(name)
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        return mountPoint
    }

    @Test("a read on a full disk (the shared-memory file cannot grow) says the disk is full, not an unexplained I/O error")
    func readOnAFullDisk_saysTheDiskIsFull() throws {
        // Filled after the keychain is written.
        let mountPoint = try fullDiskMountPoint("full")
        let script = """
            set -e
            mount -t tmpfs -o size=1m,mode=700 tmpfs "$1"
            mkdir -m 700 "$1/state"
            export XDG_STATE_HOME="$1/state"
            printf 'full disk passphrase\n' | "$2" --keychain "$1/k.lockbox" init --passphrase-stdin --kdf interactive >/dev/null
            printf 'full-disk-canary\n' | "$2" --keychain "$1/k.lockbox" add-generic-password -s svc -a acct
            rm -f "$1/k.lockbox-shm"
            dd if=/dev/zero of="$1/fill" bs=4k 2>/dev/null || true
            set +e
            "$2" --keychain "$1/k.lockbox" find-generic-password -s svc -a acct -w
            echo "exit $?"
            "$2" --keychain "$1/k.lockbox" lock --all 2>/dev/null
            exit 0
            """
        let result = try run(Self.unshare, try Self.namespaceOptions() + ["/bin/sh", "-c", script, "sh", mountPoint, binary])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardOutput.contains("exit 1"), "\(result.standardOutput)")
        #expect(result.standardError.contains("disk holding") && result.standardError.contains("is full"), "\(result.standardError)")
        #expect(!result.standardOutput.contains("canary") && !result.standardError.contains("canary"))
    }

    @Test("init on a full disk leaves no keychain behind, and the same init works once space is freed")
    func initOnAFullDisk_leavesNothing_andWorksOnceFreed() throws {
        let mountPoint = try fullDiskMountPoint("full-init")
        // The disk is filled to each of several amounts left free, so that the creation stops
        // at different points; every time, nothing is left at the keychain's path.
        let script = """
            mount -t tmpfs -o size=1m,mode=700 tmpfs "$1"
            mkdir -m 700 "$1/state" "$1/k"
            export XDG_STATE_HOME="$1/state"
            for free in 0 8 16 24 32 40; do
                dd if=/dev/zero of="$1/fill" bs=1k 2>/dev/null
                rm -f "$1/fill"; dd if=/dev/zero of="$1/fill" bs=1k count=$(( $(df -k --output=avail "$1" | tail -1) - free )) 2>/dev/null
                printf 'full disk passphrase\n' | "$2" --keychain "$1/k/k.lockbox" init --passphrase-stdin --kdf interactive >/dev/null 2>"$1/state/err"
                status=$?
                if [ $status -ne 0 ]; then
                    echo "free $free: exit $status"
                    cat "$1/state/err" >&2
                    ls -A "$1/k" | grep -v '[.]broker$' | sed 's/^/left: /'
                else
                    echo "free $free: created"; rm -f "$1/k/k.lockbox" "$1/k/k.lockbox-wal" "$1/k/k.lockbox-shm"
                fi
            done
            rm -f "$1/fill"
            printf 'full disk passphrase\n' | "$2" --keychain "$1/k/k.lockbox" init --passphrase-stdin --kdf interactive >/dev/null || echo "init after freeing failed"
            printf 'full-init-canary' | "$2" --keychain "$1/k/k.lockbox" add-generic-password -s svc -a acct || echo "add failed"
            "$2" --keychain "$1/k/k.lockbox" verify >/dev/null || echo "verify failed"
            "$2" --keychain "$1/k/k.lockbox" lock --all 2>/dev/null
            exit 0
            """
        let result = try run(Self.unshare, try Self.namespaceOptions() + ["/bin/sh", "-c", script, "sh", mountPoint, binary])
        #expect(result.status == 0, "\(result.standardError)")
        #expect(result.standardOutput.contains("free 0: exit 1"), "\(result.standardOutput)")
        #expect(!result.standardOutput.contains("left: "), "a failed init left files: \(result.standardOutput)")
        #expect(!result.standardOutput.contains("failed"), "\(result.standardOutput) \(result.standardError)")
        #expect(result.standardError.contains("was not created, and nothing was left there"), "\(result.standardError)")
        #expect(!result.standardError.contains("integrity"), "\(result.standardError)")
        #expect(!result.standardError.contains(".creating-"), "the message names the hidden file: \(result.standardError)")
    }

    @Test("init with a state directory it cannot make leaves no keychain behind")
    func initWithAStateDirectoryItCannotMake_leavesNothing() throws {
        let blocked = directory.file("blocked-state")
        // A file where the state directory's parent should be: nothing can be made under it.
        try Data("not a directory".utf8).write(to: URL(fileURLWithPath: blocked))
        let result = try run(
            binary, ["--keychain", keychain, "init", "--passphrase-stdin", "--kdf", "interactive"], input: Array((Self.passphrase + "\n").utf8),
            environment: ProcessInfo.processInfo.environment.merging(["XDG_STATE_HOME": blocked + "/state"]) { $1 })
        #expect(result.status != 0)
        #expect(!FileManager.default.fileExists(atPath: keychain), "a keychain was left at \(keychain)")
        let second = try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], text: Self.passphrase + "\n")
        #expect(second.status == 0, "\(second.standardError)")
        lockAll()
    }

    @Test("a limit of open files below what a run needs: raised within the hard limit, else refused with an error naming ulimit -n")
    func fewFileDescriptors_raisedOrRefused() throws {
        try initialize()
        defer { lockAll() }
        #expect(try lockbox(["add-generic-password", "-s", "fd", "-a", "a"], text: "fd-value").status == 0)
        // The soft limit alone lowered: raised again, and the read works.
        let soft = try run("/bin/sh", ["-c", "ulimit -S -n 10 && exec \"$0\" --keychain \"$1\" find-generic-password -s fd -a a -w", binary, keychain])
        #expect(soft.status == 0, "\(soft.standardError)")
        #expect(soft.standardOutput == "fd-value\n")
        // The hard limit too: refused before anything is opened, never a crash or a wrong cause.
        let hard = try run("/bin/sh", ["-c", "ulimit -n 13 && exec \"$0\" --keychain \"$1\" find-generic-password -s fd -a a -w", binary, keychain])
        #expect(hard.status == 64, "\(hard.status) \(hard.standardError)")
        #expect(hard.standardError.contains("ulimit -n"), "\(hard.standardError)")
        #expect(!hard.standardOutput.contains("fd-value"))
    }

    // MARK: Deletes

    @Test(
        "a delete that names no attribute is refused with 64 and deletes nothing",
        arguments: ["delete-generic-password", "delete-internet-password"])
    func deleteNamingNothing_isRefused_andDeletesNothing(verb: String) throws {
        try initialize()
        defer { lockAll() }
        #expect(try lockbox(["add-generic-password", "-s", "one", "-a", "a"], text: "1").status == 0)
        #expect(try lockbox(["add-internet-password", "-s", "host.example", "-a", "a"], text: "2").status == 0)
        let refused = try lockbox([verb])
        #expect(refused.status == 64)
        #expect(refused.standardError.contains("names no item"))
        #expect(refused.standardError.contains("--all"))
        #expect(try lockbox(["find-generic-password", "-s", "one", "-a", "a"]).status == 0)
        #expect(try lockbox(["find-internet-password", "-s", "host.example", "-a", "a"]).status == 0)
    }

    @Test("--all deletes every item of the class, no other class, and says how many")
    func deleteAll_deletesTheClass_andSaysHowMany() throws {
        try initialize()
        defer { lockAll() }
        for account in ["a", "b"] {
            #expect(try lockbox(["add-generic-password", "-s", "svc", "-a", account], text: "x").status == 0)
        }
        #expect(try lockbox(["add-internet-password", "-s", "host.example", "-a", "a"], text: "y").status == 0)
        let deleted = try lockbox(["delete-generic-password", "--all"])
        #expect(deleted.status == 0, "\(deleted.standardError)")
        #expect(deleted.standardError == "Deleted 2 items.\n")
        #expect(try lockbox(["find-generic-password", "-s", "svc"]).status == 44)
        #expect(try lockbox(["find-internet-password", "-s", "host.example", "-a", "a"]).status == 0)
    }

    @Test("every delete says how many items it removed; nothing matching exits 44")
    func delete_saysHowMany() throws {
        try initialize()
        defer { lockAll() }
        for account in ["a", "b", "c"] {
            #expect(try lockbox(["add-generic-password", "-s", "svc", "-a", account], text: "x").status == 0)
        }
        let one = try lockbox(["delete-generic-password", "-s", "svc", "-a", "a"])
        #expect(one.status == 0)
        #expect(one.standardError == "Deleted 1 item.\n")
        let two = try lockbox(["delete-generic-password", "-s", "svc"])
        #expect(two.status == 0)
        #expect(two.standardError == "Deleted 2 items.\n")
        let none = try lockbox(["delete-generic-password", "-s", "svc"])
        #expect(none.status == 44)
        #expect(none.standardError.contains("(OSStatus -25300)"))
    }

    @Test("a delete on a locked keychain deletes nothing and says it is locked")
    func deleteWhileLocked_deletesNothing() throws {
        try initialize()
        defer { lockAll() }
        #expect(try lockbox(["add-generic-password", "-s", "svc", "-a", "a"], text: "x").status == 0)
        #expect(try lockbox(["lock"]).status == 0)
        for arguments in [["delete-generic-password", "-s", "svc", "-a", "a"], ["delete-generic-password", "--all"]] {
            let refused = try lockbox(arguments)
            #expect(refused.status == 1, "\(arguments): \(refused.standardError)")
            #expect(refused.standardError.contains("(OSStatus -25308)"))
            #expect(!refused.standardError.contains("Deleted"))
        }
        let unlock = try lockbox(["unlock", "--passphrase-stdin"], text: Self.passphrase + "\n")
        #expect(unlock.status == 0)
        #expect(try secret("svc", "a").standardOutput == "x")
    }

    @Test("remove-passphrase off a terminal without --yes says how many items it would delete and changes nothing")
    func removePassphraseWithoutYes_isRefused() throws {
        try initialize()
        defer { lockAll() }
        #expect(
            try lockbox(
                ["add-generic-password", "-s", "bound", "-a", "a", "--accessibility", "whenPasscodeSetThisDeviceOnly"], text: "x"
            ).status == 0)
        #expect(try lockbox(["add-generic-password", "-s", "kept", "-a", "a"], text: "y").status == 0)
        let refused = try lockbox(["remove-passphrase", "--passphrase-stdin"], text: Self.passphrase + "\n")
        #expect(refused.status == 64)
        #expect(refused.standardError.contains("deletes 1 whenPasscodeSetThisDeviceOnly or access-controlled item(s)"))
        #expect(refused.standardError.contains("--yes"))
        #expect(try secret("bound", "a").standardOutput == "x")
        #expect(!(try lockbox(["status"]).standardOutput.contains("passphrase: none")))

        let removed = try lockbox(["remove-passphrase", "--passphrase-stdin", "--yes"], text: Self.passphrase + "\n")
        #expect(removed.status == 0, "\(removed.standardError)")
        #expect(removed.standardError.contains("1 whenPasscodeSetThisDeviceOnly"))
        #expect(try secret("bound", "a").status == 44)
        #expect(try secret("kept", "a").standardOutput == "y")
    }

    @Test("remove-passphrase on a terminal asks to confirm: anything but yes changes nothing")
    func removePassphraseOnTerminal_asksToConfirm() throws {
        try initialize()
        defer { lockAll() }
        #expect(
            try lockbox(
                ["add-generic-password", "-s", "bound", "-a", "a", "--accessibility", "whenPasscodeSetThisDeviceOnly"], text: "x"
            ).status == 0)
        let declined = try TerminalSession.run(
            binary, ["--keychain", keychain, "remove-passphrase"],
            steps: [.expect("Current passphrase: "), .type(Self.passphrase + "\n"), .expect("Type yes to go on: "), .type("no\n")])
        #expect(declined.failure.isEmpty, "\(declined.failure): \(declined.transcript)")
        #expect(declined.status == 1)
        #expect(declined.transcript.contains("deletes 1 whenPasscodeSetThisDeviceOnly"))
        #expect(declined.transcript.contains("nothing was changed"))
        #expect(try secret("bound", "a").standardOutput == "x")

        let accepted = try TerminalSession.run(
            binary, ["--keychain", keychain, "remove-passphrase"],
            steps: [.expect("Current passphrase: "), .type(Self.passphrase + "\n"), .expect("Type yes to go on: "), .type("yes\n")])
        #expect(accepted.failure.isEmpty, "\(accepted.failure): \(accepted.transcript)")
        #expect(accepted.status == 0, "\(accepted.transcript)")
        #expect(!accepted.transcript.contains(Self.passphrase), "the passphrase was echoed")
        #expect(try secret("bound", "a").status == 44)
        #expect(try lockbox(["status"]).standardOutput.contains("passphrase: none"))
    }

    // MARK: Exact bytes

    @Test("--raw stores and prints every byte value exactly, NUL, CR and LF included")
    func raw_roundTripsAll256ByteValues() throws {
        try initialize()
        defer { lockAll() }
        var generator = SeededGenerator("raw_roundTripsAll256ByteValues")
        let values: [[UInt8]] = [
            Array(0...255), Array((0...255).reversed()), [0x00], [0x0A], [0x0D, 0x0A], Array("key\n".utf8), Array("key\r\n".utf8),
            Array("key\n\n".utf8), Array("key\r".utf8), [0x00, 0x00, 0x0A, 0x00], generator.bytes(4096) + [0x0A],
        ]
        for (index, value) in values.enumerated() {
            let add = try lockbox(["add-generic-password", "-s", "bin", "-a", "\(index)", "--raw"], input: value)
            #expect(add.status == 0, "value \(index): \(add.standardError)")
            let read = try secret("bin", "\(index)")
            #expect(read.status == 0)
            #expect(read.standardOutputBytes == value, "value \(index) came back different (seed \(generator.seed))")
        }
    }

    @Test("text on stdin loses exactly one trailing \\n or \\r\\n and nothing else; -w adds one \\n")
    func text_losesOneTrailingNewlineOnly() throws {
        try initialize()
        defer { lockAll() }
        let cases: [(input: [UInt8], stored: [UInt8])] = [
            (Array("tok\n".utf8), Array("tok".utf8)),
            (Array("tok\r\n".utf8), Array("tok".utf8)),
            (Array("tok".utf8), Array("tok".utf8)),
            (Array("tok\n\n".utf8), Array("tok\n".utf8)),
            (Array("tok\r\n\r\n".utf8), Array("tok\r\n".utf8)),
            (Array("tok\r".utf8), Array("tok\r".utf8)),
            (Array("tok\n\r".utf8), Array("tok\n\r".utf8)),
            ([0x61, 0x00, 0x62, 0x0A], [0x61, 0x00, 0x62]),
            ([0x00, 0x0A], [0x00]),
        ]
        for (index, entry) in cases.enumerated() {
            let add = try lockbox(["add-generic-password", "-s", "text", "-a", "\(index)"], input: entry.input)
            #expect(add.status == 0, "case \(index): \(add.standardError)")
            #expect(try secret("text", "\(index)").standardOutputBytes == entry.stored, "case \(index) stored different bytes")
            #expect(try secret("text", "\(index)", raw: false).standardOutputBytes == entry.stored + [0x0A], "case \(index)")
        }
    }

    @Test("the largest secret (64 KiB) is stored exactly in both modes; one byte more is refused and stores nothing")
    func maximumSize_isExact_andOneMoreIsRefused() throws {
        try initialize()
        defer { lockAll() }
        let limit = 64 * 1024
        var generator = SeededGenerator("maximumSize_isExact_andOneMoreIsRefused")
        var largest = generator.bytes(limit)
        largest[limit - 1] = 0x0A
        let raw = try lockbox(["add-generic-password", "-s", "big", "-a", "raw", "--raw"], input: largest)
        #expect(raw.status == 0, "\(raw.standardError)")
        #expect(try secret("big", "raw").standardOutputBytes == largest)

        var text = largest
        text[limit - 1] = 0x41
        let textAdd = try lockbox(["add-generic-password", "-s", "big", "-a", "text"], input: text + [0x0D, 0x0A])
        #expect(textAdd.status == 0, "\(textAdd.standardError)")
        #expect(try secret("big", "text").standardOutputBytes == text)

        for (account, arguments, input) in [
            ("raw-over", ["--raw"], largest + [0x41]), ("text-over", [], text + [0x41, 0x0A]),
        ] {
            let over = try lockbox(["add-generic-password", "-s", "big", "-a", account] + arguments, input: input)
            #expect(over.status == 1)
            #expect(over.standardError.contains("over the limit of 65536 bytes"))
            #expect(try secret("big", account).status == 44)
        }
    }

    // MARK: Secrets in the wrong place

    @Test(
        "an argument that is not an option is named by its position, never echoed",
        arguments: [
            (["add-generic-password", "-s", "x", "-a", "y", "CANARY"], 8),
            (["add-generic-password", "-s", "x", "-a", "y", "-w", "-CANARY"], 0),
            (["add-generic-password", "-s", "x", "-a", "y", "-w", "CANARY"], 0),
            (["find-generic-password", "-s", "x", "CANARY"], 6),
            (["delete-generic-password", "-s", "x", "--CANARY"], 6),
            (["unlock", "CANARY"], 4),
            (["backup", "file", "CANARY"], 5),
            (["CANARY"], 3),
        ])
    func unexpectedArgument_isNamedByPosition_neverEchoed(arguments: [String], position: Int) throws {
        let canary = makeCanary("argument")
        let substituted = arguments.map { $0.replacingOccurrences(of: "CANARY", with: canary) }
        let result = try lockbox(substituted, text: "x")
        #expect(result.status == 64)
        #expect(!result.standardError.contains(canary), "the argument was echoed: \(result.standardError)")
        #expect(!result.standardOutput.contains(canary))
        if position > 0 {
            #expect(result.standardError.contains("argument \(position) is not"), "\(result.standardError)")
        } else {
            #expect(result.standardError.contains("never taken from the command line"))
        }
    }

    @Test("a mistyped global option or command asked for help is not echoed either")
    func unexpectedGlobalArgument_isNotEchoed() throws {
        let canary = makeCanary("global")
        for arguments in [["--" + canary, "status"], ["help", canary], [canary, "--help"]] {
            let result = try run(binary, arguments)
            #expect(result.status == 64, "\(arguments)")
            #expect(!result.standardError.contains(canary), "\(arguments) echoed: \(result.standardError)")
            #expect(!result.standardOutput.contains(canary))
        }
    }

    // MARK: Empty secrets

    @Test("an empty secret on stdin is refused and stores nothing unless --allow-empty", arguments: [[], Array("\n".utf8), Array("\r\n".utf8)])
    func emptySecret_isRefused(input: [UInt8]) throws {
        try initialize()
        defer { lockAll() }
        let refused = try lockbox(["add-generic-password", "-s", "empty", "-a", "a"], input: input)
        #expect(refused.status == 1)
        #expect(refused.standardError.contains("The secret is empty"))
        #expect(refused.standardError.contains("--allow-empty"))
        #expect(try secret("empty", "a").status == 44)
        let allowed = try lockbox(["add-generic-password", "-s", "empty", "-a", "a", "--allow-empty"], input: input)
        #expect(allowed.status == 0, "\(allowed.standardError)")
        let read = try secret("empty", "a")
        #expect(read.status == 0)
        #expect(read.standardOutputBytes.isEmpty)
    }

    @Test("an empty new passphrase on stdin is refused and creates no keychain")
    func emptyPassphrase_isRefused() throws {
        let result = try lockbox(["init", "--passphrase-stdin", "--kdf", "interactive"], text: "\n")
        #expect(result.status == 1)
        #expect(result.standardError.contains("passphrase is empty"))
        #expect(!FileManager.default.fileExists(atPath: keychain))
    }

    // MARK: The terminal

    @Test("on a terminal a new secret is asked twice, never echoed, and stored once both match")
    func terminalSecret_isAskedTwice() throws {
        try initialize()
        defer { lockAll() }
        let canary = makeCanary("typed")
        let add = ["--keychain", keychain, "add-generic-password", "-s", "tty", "-a", "a"]
        let differ = try TerminalSession.run(
            binary, add, steps: [.expect("Secret for tty: "), .type(canary + "\n"), .expect("Repeat it: "), .type(canary + "x\n")])
        #expect(differ.failure.isEmpty, "\(differ.failure): \(differ.transcript)")
        #expect(differ.status == 1)
        #expect(differ.transcript.contains("The two entries differ; nothing was stored."))
        #expect(try secret("tty", "a").status == 44)

        let same = try TerminalSession.run(
            binary, add, steps: [.expect("Secret for tty: "), .type(canary + "\n"), .expect("Repeat it: "), .type(canary + "\n")])
        #expect(same.failure.isEmpty, "\(same.failure): \(same.transcript)")
        #expect(same.status == 0, "\(same.transcript)")
        #expect(!differ.transcript.contains(canary) && !same.transcript.contains(canary), "the secret was echoed")
        #expect(try secret("tty", "a").standardOutput == canary)
    }

    @Test("on a terminal Enter alone is refused unless --allow-empty")
    func terminalEmptySecret_isRefused() throws {
        try initialize()
        defer { lockAll() }
        let add = ["--keychain", keychain, "add-generic-password", "-s", "tty", "-a", "a"]
        let refused = try TerminalSession.run(binary, add, steps: [.expect("Secret for tty: "), .type("\n")])
        #expect(refused.failure.isEmpty, "\(refused.failure): \(refused.transcript)")
        #expect(refused.status == 1)
        #expect(refused.transcript.contains("The secret is empty"))
        #expect(try secret("tty", "a").status == 44)

        let allowed = try TerminalSession.run(binary, add + ["--allow-empty"], steps: [.expect("Secret for tty: "), .type("\n")])
        #expect(allowed.failure.isEmpty, "\(allowed.failure): \(allowed.transcript)")
        #expect(allowed.status == 0, "\(allowed.transcript)")
        #expect(try secret("tty", "a").standardOutputBytes.isEmpty)
    }

    @Test("init on a terminal asks the new passphrase twice and refuses two that differ or an empty one")
    func terminalInit_asksPassphraseTwice() throws {
        let initialize = ["--keychain", keychain, "init", "--kdf", "interactive"]
        let differ = try TerminalSession.run(
            binary, initialize,
            steps: [.expect("New passphrase: "), .type("first words\n"), .expect("Repeat it: "), .type("other words\n")])
        #expect(differ.failure.isEmpty, "\(differ.failure): \(differ.transcript)")
        #expect(differ.status == 1)
        #expect(differ.transcript.contains("differ"))
        #expect(!FileManager.default.fileExists(atPath: keychain))

        let empty = try TerminalSession.run(binary, initialize, steps: [.expect("New passphrase: "), .type("\n")])
        #expect(empty.status == 1)
        #expect(empty.transcript.contains("passphrase is empty"))
        #expect(!FileManager.default.fileExists(atPath: keychain))

        let same = try TerminalSession.run(
            binary, initialize,
            steps: [.expect("New passphrase: "), .type("same words\n"), .expect("Repeat it: "), .type("same words\n")])
        #expect(same.failure.isEmpty, "\(same.failure): \(same.transcript)")
        #expect(same.status == 0, "\(same.transcript)")
        _ = try lockbox(["lock", "--all"])
        #expect(try lockbox(["unlock", "--passphrase-stdin"], text: "same words\n").status == 0)
        _ = try lockbox(["lock", "--all"])
    }

    @Test("unlock on a terminal gives three tries: the third right one unlocks, three wrong ones fail with -25293")
    func terminalUnlock_givesThreeTries() throws {
        try initialize()
        defer { lockAll() }
        #expect(try lockbox(["add-generic-password", "-s", "svc", "-a", "a"], text: "x").status == 0)
        #expect(try lockbox(["lock"]).status == 0)
        let unlock = ["--keychain", keychain, "unlock"]
        let prompt = "Passphrase for \(keychain): "
        let third = try TerminalSession.run(
            binary, unlock,
            steps: [
                .expect(prompt), .type("wrong one\n"), .expect("Try again."), .expect(prompt), .type("wrong two\n"),
                .expect("Try again."), .expect(prompt), .type(Self.passphrase + "\n"),
            ])
        #expect(third.failure.isEmpty, "\(third.failure): \(third.transcript)")
        #expect(third.status == 0, "\(third.transcript)")
        #expect(try secret("svc", "a").standardOutput == "x")

        #expect(try lockbox(["lock"]).status == 0)
        let wrong = try TerminalSession.run(
            binary, unlock,
            steps: [
                .expect(prompt), .type("wrong one\n"), .expect(prompt), .type("wrong two\n"), .expect(prompt), .type("wrong three\n"),
            ])
        #expect(wrong.failure.isEmpty, "\(wrong.failure): \(wrong.transcript)")
        #expect(wrong.status == 1)
        #expect(wrong.transcript.components(separatedBy: prompt).count == 4, "not three prompts: \(wrong.transcript)")
        #expect(wrong.transcript.contains("(OSStatus -25293)"))
        #expect(try secret("svc", "a").status == 1)
    }

    /// Runs `lockbox --keychain KEYCHAIN` with `arguments`, shell words in which `printf`
    /// escapes make bytes that are not UTF-8 (Swift's own arguments cannot carry them).
    func lockboxWithRawBytes(_ arguments: String, input: String = "") throws -> ProcessResult {
        try run("/bin/sh", ["-c", "exec \"$0\" --keychain \"$1\" \(arguments)", binary, keychain], input: Array(input.utf8))
    }

    @Test("a name that is not UTF-8 is refused (exit 64), never read as another name: no other item's secret is found, overwritten or deleted")
    func namesNotUTF8_areRefused() throws {
        try initialize()
        defer { lockAll() }
        // An item whose service holds U+FFFD, what Swift made of any byte that is not UTF-8.
        #expect(try lockbox(["add-generic-password", "-s", "svc\u{FFFD}", "-a", "acct"], text: "canary-not-utf8\n").status == 0)
        let found = try lockboxWithRawBytes("find-generic-password -s \"$(printf 'svc\\376')\" -a acct -w")
        #expect(found.status == 64, "\(found.status): \(found.standardError)")
        #expect(found.standardError.contains("not UTF-8"), "\(found.standardError)")
        #expect(!found.standardOutput.contains("canary") && !found.standardError.contains("canary"))
        let updated = try lockboxWithRawBytes("add-generic-password -U -s \"$(printf 'svc\\377')\" -a acct", input: "overwritten\n")
        #expect(updated.status == 64)
        let deleted = try lockboxWithRawBytes("delete-generic-password -s \"$(printf 'svc\\351')\" -a acct")
        #expect(deleted.status == 64)
        let kept = try secret("svc\u{FFFD}", "acct", raw: false)
        #expect(kept.status == 0 && kept.standardOutput == "canary-not-utf8\n", "\(kept.standardError)")
        // Also the keychain path and the sync verbs.
        #expect(try run("/bin/sh", ["-c", "exec \"$0\" --keychain \"$(printf '/tmp/k\\377')\" status", binary]).status == 64)
        #expect(try lockboxWithRawBytes("sync join \"$(printf '\\377')\"").status == 64)
        // The same for the environment: LOCKBOX_KEYCHAIN naming another file, and HOME.
        let other = directory.file("keychains/caf")
        for variable in ["LOCKBOX_KEYCHAIN=\"$(printf '\(other)\\350.lockbox')\"", "HOME=\"$(printf '/tmp/h\\377')\""] {
            let refused = try run("/bin/sh", ["-c", "export \(variable); exec \"$0\" status", binary])
            #expect(refused.status == 64 && refused.standardError.contains("is not UTF-8 text"), "\(refused.standardError)")
            let helper = try run(
                "/bin/sh", ["-c", "export \(variable); exec \"$0\" get", builtProduct("git-credential-lockbox")],
                input: Array("protocol=https\nhost=example.org\n\n".utf8))
            #expect(helper.status == 64 && helper.standardError.contains("is not UTF-8 text"), "\(helper.standardError)")
        }
        #expect(!FileManager.default.fileExists(atPath: other + "\u{FFFD}.lockbox"))
    }

    @Test("an option given twice is refused (exit 64): the last one does not silently win, so a delete never reaches another item than the first one named")
    func optionGivenTwice_isRefused() throws {
        try initialize()
        defer { lockAll() }
        for service in ["staging", "prod"] {
            #expect(try lockbox(["add-generic-password", "-s", service, "-a", "deploy"], text: "\(service)-secret\n").status == 0)
        }
        let twice = try lockbox(["delete-generic-password", "-s", "staging", "-a", "deploy", "-s", "prod"])
        #expect(twice.status == 64, "\(twice.status): \(twice.standardError)")
        #expect(twice.standardError.contains("-s is given more than once"), "\(twice.standardError)")
        for service in ["staging", "prod"] { #expect(try secret(service, "deploy").status == 0, "\(service) was deleted") }
        let accessibility = try lockbox(
            ["add-generic-password", "-s", "x", "-a", "y", "--accessibility", "whenUnlocked", "--accessibility", "always"], text: "v\n")
        #expect(accessibility.status == 64)
        let keychains = try run(binary, ["--keychain", keychain, "-k", directory.file("keychains/other.lockbox"), "status"])
        #expect(keychains.status == 64 && keychains.standardError.contains("--keychain is given more than once"), "\(keychains.standardError)")
        // A value that looks like an option is a value, not a second option.
        #expect(try lockbox(["add-generic-password", "-s", "-s", "-a", "dash"], text: "dash-secret\n").status == 0)
        #expect(try secret("-s", "dash").status == 0)
    }

    @Test("a synchronizable item with a ThisDeviceOnly accessibility is refused (errSecParam), as SecItemAdd refuses it, before anything is stored")
    func synchronizableThisDeviceOnly_isRefused() throws {
        try initialize()
        defer { lockAll() }
        for accessibility in ["afterFirstUnlockThisDeviceOnly", "whenUnlockedThisDeviceOnly"] {
            let refused = try lockbox(
                ["add-generic-password", "-s", "sync.example", "-a", "acct", "--synchronizable", "--accessibility", accessibility],
                text: "never-stored\n")
            #expect(refused.status == 1 && refused.standardError.contains("-50"), "\(refused.standardError)")
            #expect(refused.standardError.contains("ThisDeviceOnly"))
        }
        #expect(try lockbox(["find-generic-password", "-s", "sync.example", "-a", "acct"]).status == 44)
        #expect(try lockbox(["add-generic-password", "-s", "sync.example", "-a", "acct", "--synchronizable"], text: "synced\n").status == 0)
        let update = try lockbox(
            ["add-generic-password", "-U", "-s", "sync.example", "-a", "acct", "--synchronizable", "--accessibility", "whenUnlockedThisDeviceOnly"],
            text: "changed\n")
        #expect(update.status == 1 && update.standardError.contains("-50"))
        let kept = try lockbox(["find-generic-password", "-s", "sync.example", "-a", "acct", "--synchronizable", "-w"])
        #expect(kept.standardOutput == "synced\n", "\(kept.standardError)")
    }
}
