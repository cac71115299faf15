import FoundationEssentials
import LockboxCore
import LockboxVault
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// The newest version of each fleet session's fields this machine has read or written
/// (`VAULT.sync/GROUP.fleet`, mode 0600, authenticated with the device's state key). A field
/// the database serves at an older version (an older refresh token put back, which the
/// authorization server would take for reuse and answer by revoking the session everywhere) is
/// refused. A machine that never read a session has no mark for it, and trusts what it is
/// first given.
///
/// Several processes (and threads) of one machine update the file: each takes an exclusive
/// `flock` on `GROUP.fleet.lock` (``SyncLock``), reads the file, keeps the larger of each mark
/// and replaces the file whole (``Vault/writeAtomically(_:to:what:)``). A reader compares what the database
/// serves with the mark it read before asking, so a newer version another process writes
/// meanwhile is never taken for a replay.
struct FleetMarks {
    let path: String
    let key: SecretBytes

    static func path(vault: String, groupID: String) -> String { vault + ".sync/" + groupID + ".fleet" }

    /// Removes the marks at `path` of a device identity this keychain no longer has (under its
    /// state key, gone with it).
    static func removeStale(path: String) throws(LockboxError) {
        guard unlink(path) == 0 || errno == ENOENT else {
            throw LockboxError(.io, "Cannot remove \(path), the fleet marks of this keychain's earlier device. Check the directory's permissions.")
        }
    }

    static func markName(session: String, field: SyncGroup.FleetField) -> String { session + "/" + field.rawValue }

    /// The marks in the file; none when there is no file yet.
    /// - Throws: `errSecDecode` when the file was modified outside Lockbox.
    func load() throws(LockboxError) -> [String: Int64] {
        guard let data = FileManager.default.contents(atPath: path) else {
            // No file: no marks yet. A file this user cannot read (one a run as root left
            // behind, say) is not taken for none, which would turn the check off.
            if access(path, F_OK) != 0 && errno == ENOENT { return [:] }
            throw LockboxError(
                .io,
                "Cannot read \(path), this machine's record of the fleet's token versions. Give it back to this user "
                    + "(chown, mode 0600), then try again.")
        }
        let bytes = [UInt8](data)
        guard bytes.count >= Crypto.keyByteCount else { throw damaged() }
        let body = Array(bytes.dropLast(Crypto.keyByteCount))
        guard SyncHead.equal(Array(bytes.suffix(Crypto.keyByteCount)), mac(body)) else { throw damaged() }
        var decoder = FieldDecoder(body)
        guard (try? decoder.string()) == "lockbox.fleet.marks.v1", let count = try? decoder.integer(), count >= 0 else { throw damaged() }
        var marks: [String: Int64] = [:]
        for _ in 0..<count {
            guard let name = try? decoder.string(), let version = try? decoder.integer() else { throw damaged() }
            marks[name] = Int64(version)
        }
        guard decoder.isAtEnd else { throw damaged() }
        return marks
    }

    /// The newest version of a field this machine has seen; nil when none.
    func mark(session: String, field: SyncGroup.FleetField) throws(LockboxError) -> Int64? {
        try load()[Self.markName(session: session, field: field)]
    }

    /// The error for a field older than `mark`.
    func replayed() -> LockboxError {
        LockboxError(
            .decode,
            "A fleet session's token in the sync database is older than one this machine already saw: an older token was put "
                + "back (the database restored from a backup, or changed by its administrator). It was not used. Have the "
                + "database restored to its latest state; if that is not possible, sign the session in again after removing "
                + "\(path) on each machine of the fleet (which trusts the database's tokens as they are now).")
    }

    /// Raises a field's mark to `version` (never lowers it). Best effort: it runs after the
    /// database has answered or committed, and a mark not kept only weakens the check against
    /// replays on this machine; it must not turn a stored token into a failed store.
    func raise(session: String, field: SyncGroup.FleetField, to version: Int64) {
        guard let lock = try? SyncLock(lockPath: path + ".lock") else { return }
        defer { withExtendedLifetime(lock) {} }
        guard var marks = try? load() else { return }
        let name = Self.markName(session: session, field: field)
        if let mark = marks[name], mark >= version { return }
        marks[name] = version
        var encoder = FieldEncoder()
        encoder.string("lockbox.fleet.marks.v1")
        encoder.integer(marks.count)
        for (name, version) in marks.sorted(by: { $0.key < $1.key }) {
            encoder.string(name)
            encoder.integer(Int(version))
        }
        let body = encoder.bytes
        try? Vault.writeAtomically(body + mac(body), to: path, what: "the fleet's token marks", removingLeftovers: true)
    }

    private func mac(_ body: [UInt8]) -> [UInt8] {
        var encoder = FieldEncoder()
        encoder.string("lockbox.fleet.marks.mac")
        encoder.string(path.split(separator: "/").last.map(String.init) ?? "")
        encoder.bytes(body)
        return Crypto.keyedDigest(encoder.bytes, key: key)
    }

    private func damaged() -> LockboxError {
        LockboxError(
            .decode,
            "This machine's record of the fleet's token versions (\(path)) was modified outside Lockbox. Remove the file to trust "
                + "the database's tokens as they are now.")
    }
}
