import FoundationEssentials
import LockboxCore
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
/// Several processes of one machine update the file: each reads it, keeps the larger of each
/// mark, and replaces it whole. Two updates at once can lose one mark, never raise one: at
/// worst a replay of a version between the two goes unnoticed here, never a false alarm.
struct FleetMarks {
    let path: String
    let key: SecretBytes

    static func path(vault: String, groupID: String) -> String { vault + ".sync/" + groupID + ".fleet" }

    private static func markName(session: String, field: SyncGroup.FleetField) -> String { session + "/" + field.rawValue }

    /// The marks in the file; none when there is no file yet.
    func load() throws(LockboxError) -> [String: Int64] {
        guard let data = FileManager.default.contents(atPath: path) else { return [:] }
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

    /// Checks `version` of a field against its mark, and raises the mark to it.
    /// - Throws: `errSecDecode` when the database served an older version than this machine saw.
    func check(session: String, field: SyncGroup.FleetField, version: Int64) throws(LockboxError) {
        var marks = try load()
        let name = Self.markName(session: session, field: field)
        if let mark = marks[name] {
            guard version >= mark else {
                throw LockboxError.syncDatabase("A fleet session's token in the sync database (older than one this machine already saw)")
            }
            if version == mark { return }
        }
        marks[name] = version
        try save(marks)
    }

    private func save(_ marks: [String: Int64]) throws(LockboxError) {
        var encoder = FieldEncoder()
        encoder.string("lockbox.fleet.marks.v1")
        encoder.integer(marks.count)
        for (name, version) in marks.sorted(by: { $0.key < $1.key }) {
            encoder.string(name)
            encoder.integer(Int(version))
        }
        let body = encoder.bytes
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        if !directory.isEmpty && mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw LockboxError(.io, "Cannot create \(directory) (errno \(errno)). Check its parent's permissions.")
        }
        let temporary = path + ".\(getpid()).tmp"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else { throw LockboxError(.io, "Cannot write \(temporary) (errno \(errno)). Check the directory's permissions.") }
        let contents = body + mac(body)
        let written = contents.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        let synced = fsync(descriptor) == 0
        close(descriptor)
        guard written == contents.count, synced, rename(temporary, path) == 0 else {
            unlink(temporary)
            throw LockboxError(.io, "Cannot write \(path) (errno \(errno)). Check the disk and the directory's permissions.")
        }
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
