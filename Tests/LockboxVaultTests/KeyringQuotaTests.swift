import Foundation
import Glibc
import KeyProviders
import Lockbox
import LockboxTestSupport
import Testing

/// An ordinary user may keep 200 keys and 20,000 bytes in the kernel keyring (root's quota is
/// far larger, so these tests run the built `lockbox` as an unprivileged user). Lockbox keeps
/// a bounded number of vaults' keys and frees those of deleted vaults.
@Suite("Kernel keyring quota of an ordinary user", .serialized)
struct KeyringQuotaTests {
    static let userName = "lockbox-quota"

    /// The unprivileged user the tests run as: this one when the tests already run unprivileged,
    /// else `lockbox-quota`, created when missing.
    static func testUser() throws -> (uid: uid_t, gid: gid_t) {
        if getuid() != 0 { return (getuid(), getgid()) }
        if let entry = getpwnam(userName) { return (entry.pointee.pw_uid, entry.pointee.pw_gid) }
        let created = try run(
            "/usr/sbin/useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", userName])
        #expect(created.status == 0 || created.status == 9, "useradd failed: \(created.standardError)")
        guard let entry = getpwnam(userName) else { throw QuotaTestError.noUser }
        return (entry.pointee.pw_uid, entry.pointee.pw_gid)
    }

    enum QuotaTestError: Error { case noUser }

    /// A directory the test user owns, holding a copy of the built `lockbox` it can run.
    final class UserSandbox {
        let directory: TemporaryDirectory
        let user: (uid: uid_t, gid: gid_t)
        var binary: String { directory.file("lockbox") }

        init() throws {
            user = try KeyringQuotaTests.testUser()
            directory = TemporaryDirectory("lockbox-quota")
            let copy = try run("/bin/cp", [builtProduct("lockbox"), directory.file("lockbox")])
            #expect(copy.status == 0, "copying lockbox failed: \(copy.standardError)")
            // Explicitly: a vault being created on another thread may have narrowed the umask.
            #expect(chmod(directory.file("lockbox"), 0o755) == 0)
            if getuid() == 0 { #expect(chown(directory.path, user.uid, user.gid) == 0) }
            // The directory is directly in /tmp, which every user may enter.
            #expect(directory.path.hasPrefix("/tmp/") && !directory.path.dropFirst(5).contains("/"))
            // The test user's keys are the test's own: whatever an earlier run (on this kernel,
            // which outlives runs) left, such as a test stopped half-way, is cleared. Not when the
            // tests run as an ordinary user: those keys are that user's.
            if getuid() == 0 {
                let cleared = try runAsUser("keyctl clear @u")
                #expect(cleared.status == 0, "keyctl clear @u as \(KeyringQuotaTests.userName): \(cleared.standardError)")
            }
        }

        /// Runs a shell script as the test user, with HOME in the sandbox.
        func runAsUser(_ script: String, timeout: Double = 600) throws -> ProcessResult {
            if getuid() != 0 {
                return try run("/bin/sh", ["-c", script], environment: ["PATH": "/usr/bin:/bin"], directory: directory.path, timeout: timeout)
            }
            return try run(
                "/usr/bin/setpriv",
                [
                    "--reuid=\(user.uid)", "--regid=\(user.gid)", "--clear-groups", "--reset-env", "--",
                    "/bin/sh", "-c", script,
                ],
                environment: [:], directory: directory.path, timeout: timeout)
        }

        /// Runs a script of the tests' own as the test user: `set -e`, HOME in the sandbox, and
        /// `init_vault NAME`, which makes the vault NAME.lockbox there (unlocked).
        func runScript(_ body: String, timeout: Double = 600) throws -> ProcessResult {
            try runAsUser(
                """
                set -e
                export HOME="$PWD"
                init_vault() { printf 'pw' | ./lockbox --keychain "$PWD/$1.lockbox" init --passphrase-stdin --kdf interactive >/dev/null; }
                """ + "\n" + body, timeout: timeout)
        }

        /// Writes a file the test user can read.
        func writeFile(_ name: String, _ text: String) throws {
            try text.write(toFile: directory.file(name), atomically: false, encoding: .utf8)
            #expect(chmod(directory.file(name), 0o644) == 0)
        }

        /// The quota use once the kernel's garbage collector, which frees invalidated keys
        /// asynchronously, has caught up: polled until it is within `keys` or 5 s passed.
        func settledQuotaUse(atMostKeys keys: Int) throws -> (keys: Int, bytes: Int) {
            var use = try quotaUse()
            var waited = 0
            while use.keys > keys && waited < 100 {
                usleep(50_000)
                waited += 1
                use = try quotaUse()
            }
            return use
        }

        /// The quota use once it has not moved for 200 ms (the collector done), or after 5 s.
        func quietQuotaUse() throws -> (keys: Int, bytes: Int) {
            var use = try quotaUse()
            for _ in 0..<25 {
                usleep(200_000)
                let now = try quotaUse()
                if now == use { break }
                use = now
            }
            return use
        }

        /// The bytes Lockbox's own keys hold, as the kernel charges a key (its description and
        /// its payload), summed over the user's keys in /proc/keys that Lockbox made (the
        /// `lockbox` keyring and the `lockbox:` entries). /proc/key-users' byte count is not used
        /// for this: after earlier runs' keys were freed it was seen to stay up to 1,600 bytes
        /// higher for the very same set of keys.
        func lockboxKeyBytes() throws -> Int {
            let table = try runAsUser("cat /proc/keys").standardOutput
            var total = 0
            for line in table.split(separator: "\n") {
                // serial flags usage timeout perm uid gid type description: datalen
                let fields = line.split(separator: " ", omittingEmptySubsequences: true)
                guard fields.count >= 10, fields[5] == "\(user.uid)" else { continue }
                let rest = fields[8...].joined(separator: " ")
                guard let colon = rest.lastIndex(of: ":"), let length = Int(rest[rest.index(after: colon)...].trimmingCharacters(in: .whitespaces))
                else { continue }
                let description = rest[..<colon]
                guard description == "lockbox" || description.hasPrefix("lockbox:") else { continue }
                total += description.utf8.count + length
            }
            return total
        }

        /// The user's kernel key quota use: (keys, bytes), from /proc/key-users.
        func quotaUse() throws -> (keys: Int, bytes: Int) {
            let table = try run("/bin/cat", ["/proc/key-users"]).standardOutput
            for line in table.split(separator: "\n") {
                let fields = line.split(whereSeparator: { $0 == " " || $0 == ":" })
                guard fields.count >= 5, fields[0] == "\(user.uid)" else { continue }
                let keys = fields[3].split(separator: "/")
                let bytes = fields[4].split(separator: "/")
                return (Int(keys[0]) ?? -1, Int(bytes[0]) ?? -1)
            }
            return (0, 0)
        }
    }

    @Test("an ordinary user creates and unlocks 200 vaults in a row and stays far inside the key quota")
    func twoHundredVaults_asOrdinaryUser_allUnlock_andQuotaStaysBounded() throws {
        let sandbox = try UserSandbox()
        let script = """
            set -e
            export HOME="$PWD"
            i=1
            while [ $i -le 200 ]; do
                printf 'passphrase %s' $i | ./lockbox --keychain "$PWD/v$i.lockbox" init --passphrase-stdin --kdf interactive >/dev/null
                i=$((i + 1))
            done
            # The first vault's keys were freed long ago: it is locked, and unlocks again.
            ./lockbox --keychain "$PWD/v1.lockbox" status | grep -q 'state: locked'
            printf 'passphrase 1' | ./lockbox --keychain "$PWD/v1.lockbox" unlock --passphrase-stdin >/dev/null
            ./lockbox --keychain "$PWD/v1.lockbox" status | grep -q 'state: unlocked'
            ./lockbox --keychain "$PWD/v200.lockbox" status | grep -q 'state: unlocked'
            echo done
            """
        let result = try sandbox.runAsUser(script)
        #expect(result.status == 0, "as \(Self.userName): \(result.standardError)")
        #expect(result.standardOutput.contains("done"))
        #expect(!result.standardError.contains("quota"), "\(result.standardError)")
        // Half the quota: 20 vaults x 3 entries (two keys, the generation), the lockbox keyring
        // and the user's own two keyrings.
        let use = try sandbox.settledQuotaUse(atMostKeys: 3 * 20 + 3)
        #expect(use.keys <= 3 * 20 + 3, "the user holds \(use.keys) keys")
        // Half the byte quota (20,000 bytes for an ordinary user), with the keyrings' own.
        let bytes = try sandbox.lockboxKeyBytes()
        #expect(bytes > 0, "no Lockbox key was seen in /proc/keys")
        #expect(bytes <= 10_000, "Lockbox's keys hold \(bytes) bytes (the kernel counts \(use.bytes) for the user)")
    }

    @Test("the keys of vaults whose files were deleted are freed at the next unlock")
    func deletedVaults_haveTheirKeysFreed_atTheNextUnlock() throws {
        let sandbox = try UserSandbox()
        let script = """
            set -e
            export HOME="$PWD"
            for i in 1 2 3 4 5 6; do
                printf 'pw' | ./lockbox --keychain "$PWD/gone$i.lockbox" init --passphrase-stdin --kdf interactive >/dev/null
            done
            rm -f "$PWD"/gone*
            printf 'pw' | ./lockbox --keychain "$PWD/kept.lockbox" init --passphrase-stdin --kdf interactive >/dev/null
            echo done
            """
        let before = try sandbox.quotaUse()
        let result = try sandbox.runAsUser(script)
        #expect(result.status == 0, "as \(Self.userName): \(result.standardError)")
        let after = try sandbox.settledQuotaUse(atMostKeys: 3 + 3)
        // Whatever earlier runs left (their files are gone too) is freed; the six deleted
        // vaults' entries are freed; only the kept vault's three (two keys and its generation)
        // and the keyrings remain.
        #expect(after.keys <= 3 + 3, "before: \(before.keys) keys; after: \(after.keys) keys")
        let listing = try sandbox.runAsUser("keyctl show @u 2>&1")
        #expect(listing.standardOutput.split(separator: "\n").filter { $0.contains("lockbox:v1:") }.count == 3, "\(listing.standardOutput)")
    }

    @Test("a deleted vault's keys leave the kernel keyring when another vault is unlocked")
    func deletedVault_keysLeaveTheKeyring_atAnotherUnlock() throws {
        let gone = try VaultFixture()
        let identifier = gone.vault.identifier
        #expect(unlink(gone.path) == 0)
        let kept = try VaultFixture()
        for kind in ["unlocked", "after-first-unlock"] {
            #expect(throws: KernelKeyring.Absence.self) { _ = try KernelKeyring.find("lockbox:v1:\(identifier):\(kind)") }
            #expect((try? KernelKeyring.find("lockbox:v1:\(kept.vault.identifier):\(kind)")) != nil)
        }
        // Stored in the `lockbox` keyring, not loose in @u.
        let listing = try run("/usr/bin/keyctl", ["show", "@u"]).standardOutput
        #expect(listing.contains("keyring: lockbox"), "\(listing)")
    }

    @Test("a vault whose path is too long to record keeps its keys when another vault is unlocked (before, a cut path named no file, and its keys were freed as stale)")
    func longPathVault_keepsItsKeys_atAnotherUnlock() throws {
        let directory = TemporaryDirectory()
        let nested = directory.file(String(repeating: "d", count: 60) + "/" + String(repeating: "e", count: 60) + "/" + String(repeating: "f", count: 60))
        try FileManager.default.createDirectory(atPath: nested, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let path = nested + "/vault-with-a-long-path.lockbox"
        #expect(path.utf8.count > 200)
        let vault = try Vault.create(at: path, passphrase: SecretBytes(utf8: "long path passphrase"))
        var item = Item.genericPassword(service: "svc", account: "alice", data: SecretBytes(utf8: "kept"))
        item.attributes.accessibility = .afterFirstUnlock
        try vault.add(item)
        _ = try VaultFixture()  // an unlock of another vault frees what is stale
        for kind in ["unlocked", "after-first-unlock"] {
            #expect((try? KernelKeyring.find("lockbox:v1:\(vault.identifier):\(kind)")) != nil, "\(kind) was freed")
        }
        #expect(try Vault.open(at: path).data(matching: .genericPassword(service: "svc", account: "alice")) == SecretBytes(utf8: "kept"))
        vault.lockAll()
    }

    @Test("an entry loose in @u (where earlier releases kept them) is freed once its vault file is gone")
    func looseEntryInUserKeyring_ofDeletedVault_isFreed() throws {
        let directory = TemporaryDirectory()
        let identifier = (0..<16).map { _ in String(UInt8.random(in: 0...255), radix: 16).leftPadded(to: 2) }.joined()
        let description = "lockbox:v1:\(identifier):after-first-unlock"
        // Keys (placeholder bytes), unlock time, then the path of a vault that no longer exists.
        let payload = [UInt8](repeating: 7, count: 96) + withUnsafeBytes(of: Int64(1).littleEndian) { Array($0) }
            + Array(directory.file("deleted.lockbox").utf8)
        let added = try run("/usr/bin/keyctl", ["padd", "user", description, "@u"], input: payload)
        #expect(added.status == 0, "keyctl padd failed: \(added.standardError)")
        #expect((try? KernelKeyring.find(description)) != nil)

        _ = try VaultFixture()  // an unlock

        #expect(throws: KernelKeyring.Absence.self) { _ = try KernelKeyring.find(description) }
    }

    /// Locks and unlocks, repeated, hold no quota once the kernel has freed the keys: each removed
    /// key is unlinked before it is invalidated (the kernel keeps a link's 4 bytes charged when
    /// its collector drops an invalidated key's link, and `lockbox` keyrings live until reboot).
    @Test("locking and unlocking again and again leaves the user's key quota where it was")
    func lockUnlockCycles_giveEveryByteBack() throws {
        let sandbox = try UserSandbox()
        #expect(try sandbox.runScript("init_vault cycle; echo done").standardOutput.contains("done"))
        let before = try sandbox.quietQuotaUse()
        let cycles = """
            i=0
            while [ $i -lt 60 ]; do
                ./lockbox --keychain "$PWD/cycle.lockbox" lock --all
                printf 'pw' | ./lockbox --keychain "$PWD/cycle.lockbox" unlock --passphrase-stdin >/dev/null
                i=$((i + 1))
            done
            echo done
            """
        let result = try sandbox.runScript(cycles)
        #expect(result.status == 0 && result.standardOutput.contains("done"), "\(result.standardError)")
        let after = try sandbox.quietQuotaUse()
        // 60 cycles of two removed keys: 480 bytes if links were dropped by the collector.
        #expect(after.keys == before.keys, "keys: \(before.keys) before, \(after.keys) after")
        #expect(after.bytes - before.bytes < 40, "bytes: \(before.bytes) before, \(after.bytes) after 60 lock/unlock cycles")
    }

    /// Drops links in the `lockbox` keyring (python3 dropLinks.py ROOM) until ROOM to ROOM + 4
    /// bytes of the quota are left: no entry fits.
    static let dropLinks = """
        import ctypes, os, sys, time
        keyutils = ctypes.CDLL("libkeyutils.so.1", use_errno=True)
        keyutils.add_key.restype = ctypes.c_int32
        keyutils.keyctl_search.restype = ctypes.c_long
        ring = ctypes.c_int32(keyutils.keyctl_search(-4, b"keyring", b"lockbox", 0))
        assert ring.value > 0, "no lockbox keyring"
        room = int(sys.argv[1])

        def use():
            for line in open("/proc/key-users"):
                fields = line.split()
                if fields[0] == "%d:" % os.getuid():
                    used, limit = map(int, fields[4].split("/"))
                    return int(fields[3].split("/")[0]), used, limit

        def settled(keys):
            for _ in range(500):
                now = use()
                if now[0] <= keys:
                    return now
                time.sleep(0.01)
            raise SystemExit("the kernel's collector did not free the invalidated keys")

        keys, used, limit = settled(10**6)
        dropped = 0
        while limit - used > room + 4:
            # Each key costs up to 9 bytes until it is collected, its link's 4 for good. A
            # name of its own in the batch: a key added under the name of one not yet
            # collected would take its link's place, costing nothing.
            for name in range(max(1, min(40, (limit - used - room) // 10))):
                serial = keyutils.add_key(b"user", b"d%d" % name, b"x", 1, ring)
                assert serial > 0, ctypes.get_errno()
                keyutils.keyctl_invalidate(serial)
                dropped += 1
            keys, used, limit = settled(keys)
        print("dropped", dropped, "free", limit - used)
        """

    /// A `lockbox` keyring whose quota is used up by links the kernel's collector dropped without
    /// giving their charge back (timed-out keys, earlier releases): the next store succeeds.
    /// With 16 bytes of room the keyring is renewed and the keys already cached stay usable;
    /// with less, the unlock makes room from other vaults' keys first (as for a quota full of
    /// other programs' keys): the vault cached before reads as locked (never as missing) until
    /// unlocked again. Four processes meeting the full quota at once renew it one at a time
    /// (two renewals at once would lose keys).
    @Test(
        "a quota used up by dropped links is recovered by four unlocks at once",
        arguments: [(room: 26, earlierVault: "unlocked"), (room: 8, earlierVault: "locked")])
    func quotaHeldByDroppedLinks_isRecovered_byTheNextStore(room: Int, earlierVault: String) throws {
        let sandbox = try UserSandbox()
        try sandbox.writeFile("fill.py", Self.dropLinks)
        let script = """
            init_vault first
            /usr/bin/python3 fill.py \(room)
            # Full: no key of an entry's size fits.
            if keyctl add user lockbox:probe "$(head -c 64 /dev/zero | tr '\\0' x)" @u >/dev/null 2>&1; then echo "quota not full"; exit 1; fi
            for i in 1 2 3 4; do
                (init_vault "next$i" 2>"next$i.err"; echo $? >"next$i.status") &
            done
            wait
            cat next*.err >&2
            for i in 1 2 3 4; do
                [ "$(cat next$i.status)" = 0 ]
                ./lockbox --keychain "$PWD/next$i.lockbox" status | grep 'state:' | sed "s/^/next: /"
            done
            ./lockbox --keychain "$PWD/first.lockbox" status | grep 'state:' | sed "s/^/first: /"
            echo done
            """
        let result = try sandbox.runScript(script, timeout: 300)
        #expect(result.status == 0 && result.standardOutput.contains("done"), "\(result.standardOutput) \(result.standardError)")
        #expect(result.standardOutput.contains("dropped"), "\(result.standardOutput)")
        #expect(result.standardOutput.contains("first: state: \(earlierVault)"), "\(result.standardOutput)")
        let states = result.standardOutput.split(separator: "\n").filter { $0.hasPrefix("next: ") }
        #expect(states.count == 4, "\(result.standardOutput)")
        if earlierVault == "unlocked" {
            // Renewed: nothing was given up.
            #expect(states.allSatisfy { $0.hasSuffix("state: unlocked") }, "\(result.standardOutput)")
        } else {
            // Too little room to renew: each process made room from other vaults' keys, so a
            // vault unlocked a moment before may read as locked (never as missing).
            #expect(states.allSatisfy { $0.hasSuffix("state: unlocked") || $0.hasSuffix("state: locked") }, "\(result.standardOutput)")
            #expect(states.contains { $0.hasSuffix("state: unlocked") }, "\(result.standardOutput)")
        }
        let after = try sandbox.settledQuotaUse(atMostKeys: 4 + 3)
        // A few vaults' entries (about 480 bytes each) and the keyrings: far from the full quota.
        #expect(after.bytes < 2_600, "the user's keys hold \(after.bytes) bytes after the renewal")
    }

    /// A renewal killed part-way leaves its new keyring inside the old one, holding some keys:
    /// they stay found, and the next renewal carries on with that keyring instead of making
    /// another one (which would take its place in the old keyring and drop its keys).
    @Test("a renewal stopped part-way is carried on by the next, and no key is lost")
    func renewalStoppedPartWay_isCarriedOn_byTheNext() throws {
        let sandbox = try UserSandbox()
        try sandbox.writeFile("fill.py", Self.dropLinks)
        let script = """
            init_vault first
            # What a renewal killed after its first moves leaves.
            outer=$(keyctl search @u keyring lockbox)
            nested=$(keyctl newring lockbox "$outer")
            keyctl setperm "$nested" 0x3f3f0000
            for key in $(keyctl rlist "$outer"); do
                case "$(keyctl rdescribe "$key")" in user\\;*) keyctl move "$key" "$outer" "$nested" ;; esac
            done
            ./lockbox --keychain "$PWD/first.lockbox" status | grep 'state:'
            /usr/bin/python3 fill.py 26
            init_vault second
            ./lockbox --keychain "$PWD/second.lockbox" status | grep 'state:'
            ./lockbox --keychain "$PWD/first.lockbox" status | grep 'state:'
            keyctl show @u
            echo done
            """
        let result = try sandbox.runScript(script, timeout: 300)
        #expect(result.status == 0 && result.standardOutput.contains("done"), "\(result.standardOutput) \(result.standardError)")
        #expect(result.standardOutput.components(separatedBy: "state: unlocked").count == 4, "\(result.standardOutput)")
        #expect(result.standardOutput.components(separatedBy: "keyring: lockbox").count == 2, "one lockbox keyring left: \(result.standardOutput)")
        let after = try sandbox.settledQuotaUse(atMostKeys: 4 + 3)
        // A few vaults' entries (about 480 bytes each) and the keyrings: far from the full quota.
        #expect(after.bytes < 2_600, "the user's keys hold \(after.bytes) bytes after the renewal")
    }

    /// A timed-out key's link, which the collector would drop (keeping its charge) only minutes
    /// later, is unlinked at the next unlock of any vault.
    @Test("a timed-out key's link is unlinked at the next unlock")
    func timedOutKeysLink_isUnlinked_atTheNextUnlock() throws {
        let sandbox = try UserSandbox()
        let script = """
            init_vault short
            printf 'pw' | ./lockbox --keychain "$PWD/short.lockbox" unlock --passphrase-stdin --timeout 1 >/dev/null
            sleep 2
            keyctl show @u > before.txt 2>&1
            init_vault other
            keyctl show @u > after.txt 2>&1
            echo done
            """
        let result = try sandbox.runScript(script)
        #expect(result.status == 0 && result.standardOutput.contains("done"), "\(result.standardError)")
        let before = try String(contentsOfFile: sandbox.directory.file("before.txt"), encoding: .utf8)
        let after = try String(contentsOfFile: sandbox.directory.file("after.txt"), encoding: .utf8)
        #expect(before.contains("expired"), "the timed-out key is still linked before: \(before)")
        #expect(!after.contains("expired"), "after the next unlock: \(after)")
    }

    @Test("a full quota is reported with the quota's files and what to do")
    func fullQuota_errorNamesTheQuotaAndTheRemedy() throws {
        let sandbox = try UserSandbox()
        // Fill the user's quota with other keys, as another program could, then init a vault.
        let script = """
            export HOME="$PWD"
            keyctl clear @u >/dev/null 2>&1
            i=0
            for size in 900 90 9 1; do
                while keyctl add user "filler:$i" "$(head -c $size /dev/zero | tr '\\0' x)" @u >/dev/null 2>&1; do
                    i=$((i + 1))
                    [ $i -gt 400 ] && break
                done
            done
            printf 'pw' | ./lockbox --keychain "$PWD/full.lockbox" init --passphrase-stdin --kdf interactive
            status=$?
            keyctl clear @u >/dev/null 2>&1
            exit $status
            """
        let result = try sandbox.runAsUser(script)
        #expect(result.status == 1, "init with a full quota: \(result.status) \(result.standardError)")
        #expect(result.standardError.contains("/proc/sys/kernel/keys/maxbytes"), "\(result.standardError)")
        #expect(result.standardError.contains("lockbox lock --all"), "\(result.standardError)")
        #expect(result.standardError.contains("LOCKBOX_UNLOCK_CACHE=process"), "\(result.standardError)")
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        String(repeating: "0", count: max(0, width - count)) + self
    }
}
