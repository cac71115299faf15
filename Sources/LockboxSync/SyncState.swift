import FoundationEssentials
import LockboxCore
import VaultCrypto

#if canImport(Glibc)
import Glibc
#endif

/// What one device knows of its group, kept next to its vault (`VAULT.sync/GROUP.state`, mode
/// 0600): its device identifier, how far it has pulled (`cursor`), and per item the last
/// version it saw or wrote (stamp and content digest). Nothing in it is secret (identifiers
/// are opaque, digests keyed); it is authenticated with a key of the group, so an edited file
/// is an error, not a reason to re-send or skip items.
///
/// It is written after each phase of a sync commits; a crash before that only repeats work:
/// pushing an item whose record is already the database's is a no-op, and pulling a record
/// already applied changes nothing.
struct SyncState {
    struct Entry: Equatable {
        var stamp: SyncStamp
        var contentDigest: [UInt8]
        var isTombstone: Bool
    }

    var device: String
    var cursor: Int64 = 0
    var entries: [String: Entry] = [:]

    static func load(_ path: String, keys: SyncKeys) throws(LockboxError) -> SyncState? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        let failure = LockboxError.integrity("The sync state \(path)")
        var outer = FieldDecoder(Array(data))
        guard let body = try? outer.bytes(), let mac = try? outer.bytes(), outer.isAtEnd,
            Crypto.keyedDigest(body, key: keys.state) == mac
        else { throw failure }
        var decoder = FieldDecoder(body)
        guard let tag = try? decoder.string(), tag == "lockbox.sync.state.v1",
            let device = try? decoder.string(), let cursor = try? decoder.integer(), let count = try? decoder.integer()
        else { throw failure }
        var state = SyncState(device: device, cursor: Int64(cursor))
        for _ in 0..<max(0, count) {
            guard let id = try? decoder.string(), let modified = try? decoder.integer(), let writer = try? decoder.string(),
                let digest = try? decoder.bytes(), let tombstone = try? decoder.integer()
            else { throw failure }
            state.entries[id] = Entry(
                stamp: SyncStamp(modified: Int64(modified), device: writer), contentDigest: digest, isTombstone: tombstone == 1)
        }
        guard decoder.isAtEnd else { throw failure }
        return state
    }

    func save(_ path: String, keys: SyncKeys) throws(LockboxError) {
        var encoder = FieldEncoder()
        encoder.string("lockbox.sync.state.v1")
        encoder.string(device)
        encoder.integer(Int(cursor))
        encoder.integer(entries.count)
        for (id, entry) in entries.sorted(by: { $0.key < $1.key }) {
            encoder.string(id)
            encoder.integer(Int(entry.stamp.modified))
            encoder.string(entry.stamp.device)
            encoder.bytes(entry.contentDigest)
            encoder.integer(entry.isTombstone ? 1 : 0)
        }
        var outer = FieldEncoder()
        outer.bytes(encoder.bytes)
        outer.bytes(Crypto.keyedDigest(encoder.bytes, key: keys.state))
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        let oldMask = umask(0o077)
        defer { umask(oldMask) }
        do {
            if !directory.isEmpty {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            }
            try Data(outer.bytes).write(to: URL(fileURLWithPath: path), options: .atomic)
        } catch {
            throw LockboxError(.io, "Cannot write the sync state \(path). Check the disk and the directory's permissions, then sync again.")
        }
    }
}
