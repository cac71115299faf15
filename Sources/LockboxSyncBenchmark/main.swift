import Foundation
import Lockbox
import LockboxSync
import LockboxVault
import VaultStorage
import VaultCrypto
import Dispatch

#if canImport(Glibc)
import Glibc
#endif

// Sync against its floor (docs/SYNC.md, "Figures"): a new device's first sync of N items beside
// a plain `COPY ... TO STDOUT` of the same ciphertext rows, and an incremental sync of 10
// changed items among M (push on the writer, pull on the reader). Run against a PostgreSQL that
// `scripts/postgres start` made:
//
//   LOCKBOX_TEST_POSTGRES="$(scripts/postgres start)" swift run -c release lockbox-sync-bench [--items 10000] [--among 100000] [--rounds 3]
//
// `--rounds` repeats the ten changes that many more times, each pulled by the reader's vault
// opened anew (as a new process opens it: no bucket verified, no key cached but by the unlock).
//
// To profile the first sync alone: `perf record -D -1 --control fifo:CTL,ACK ...` with
// LOCKBOX_PERF_CONTROL=CTL,ACK in the environment; the bench enables perf around that sync only,
// or around the writer's first push with LOCKBOX_PERF_PHASE=push, or around the sync that pushes
// (pulls) the ten changes among M with LOCKBOX_PERF_PHASE=incremental-push (incremental-pull).

var items = 10_000
var among = 100_000
var rounds = 3
var iterator = CommandLine.arguments.dropFirst().makeIterator()
while let argument = iterator.next() {
    switch argument {
    case "--items": items = Int(iterator.next() ?? "") ?? items
    case "--among": among = Int(iterator.next() ?? "") ?? among
    case "--rounds": rounds = Int(iterator.next() ?? "") ?? rounds
    default:
        FileHandle.standardError.write(Data("usage: lockbox-sync-bench [--items N] [--among M] [--rounds R]\n".utf8))
        exit(64)
    }
}
guard let database = ProcessInfo.processInfo.environment["LOCKBOX_TEST_POSTGRES"] else {
    FileHandle.standardError.write(Data("lockbox-sync-bench: set LOCKBOX_TEST_POSTGRES to a connection string (scripts/postgres start)\n".utf8))
    exit(64)
}

/// perf's control and acknowledgement fifos (LOCKBOX_PERF_CONTROL="ctl,ack"), if profiling.
let perfControl: (control: Int32, acknowledgement: Int32)? = {
    guard let paths = ProcessInfo.processInfo.environment["LOCKBOX_PERF_CONTROL"]?.split(separator: ","), paths.count == 2 else {
        return nil
    }
    let control = open(String(paths[0]), O_WRONLY)
    let acknowledgement = open(String(paths[1]), O_RDONLY)
    return control >= 0 && acknowledgement >= 0 ? (control, acknowledgement) : nil
}()

/// Tells perf to start or stop sampling and waits for its answer.
func perf(_ command: String) {
    guard let perfControl else { return }
    _ = command.withCString { write(perfControl.control, $0, strlen($0)) }
    var answer = [UInt8](repeating: 0, count: 8)
    _ = read(perfControl.acknowledgement, &answer, answer.count)
}

func seconds(_ body: () throws -> Void) rethrows -> Double {
    var start = timespec()
    var end = timespec()
    clock_gettime(CLOCK_MONOTONIC, &start)
    try body()
    clock_gettime(CLOCK_MONOTONIC, &end)
    return Double(end.tv_sec - start.tv_sec) + Double(end.tv_nsec - start.tv_nsec) / 1e9
}

let root = FileManager.default.temporaryDirectory.appendingPathComponent("lockbox-sync-bench-\(getpid())").path
defer { try? FileManager.default.removeItem(atPath: root) }

/// A machine: its own vault and device key.
func settings(_ name: String) -> Vault.Configuration {
    var configuration = Vault.Configuration()
    configuration.keyDerivation = .interactive
    configuration.device = DeviceIdentity(keyPath: root + "/\(name)/state/device-key")
    return configuration
}

func machine(_ name: String) throws -> Vault {
    let configuration = settings(name)
    try FileManager.default.createDirectory(
        atPath: root + "/\(name)/data", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    chmod(root, 0o700)
    chmod(root + "/\(name)", 0o700)
    return try Vault.create(at: root + "/\(name)/data/default.lockbox", passphrase: SecretBytes(utf8: "benchmark"), configuration: configuration)
}

func fill(_ vault: Vault, count: Int, prefix: String) throws {
    for start in stride(from: 0, to: count, by: 1000) {
        let batch = (start..<min(start + 1000, count)).map { index in
            var item = Item.genericPassword(
                service: "\(prefix)-\(index).example", account: "user\(index)", data: SecretBytes(utf8: "value \(index) \(String(repeating: "x", count: 40))"))
            item.attributes.synchronizable = true
            return item
        }
        try vault.add(contentsOf: batch)
    }
}

/// CPU time (user and system) this process has used so far, in seconds.
func processorSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

func row(_ label: String, _ value: Double, _ note: String = "") {
    print(label.padding(toLength: 58, withPad: " ", startingAt: 0) + String(format: "%10.1f ms", value * 1000) + (note.isEmpty ? "" : "  " + note))
}

do {
    print("lockbox-sync-bench: release build, PostgreSQL on loopback, one run")
    // 1. A new device's first sync of `items` items against COPY of the same rows.
    let writer = try machine("writer")
    try fill(writer, count: items, prefix: "first")
    let group = try SyncGroup.create(vault: writer, database: database, passphrase: SecretBytes(utf8: "benchmark group"))
    let profilesPush = ProcessInfo.processInfo.environment["LOCKBOX_PERF_PHASE"] == "push"
    if profilesPush { perf("enable\n") }
    let push = try seconds { try group.sync() }
    if profilesPush { perf("disable\n") }
    let reader = try machine("reader")
    let joined = try SyncGroup.join(group.groupID, vault: reader, database: database, passphrase: SecretBytes(utf8: "benchmark group"))
    var pulled = 0
    let firstProcessorBefore = processorSeconds()
    let profilesFirstSync = ProcessInfo.processInfo.environment["LOCKBOX_PERF_PHASE"] == nil
    if profilesFirstSync { perf("enable\n") }
    let firstSync = try seconds { pulled = try joined.sync().pulled }
    if profilesFirstSync { perf("disable\n") }
    let firstProcessor = processorSeconds() - firstProcessorBefore
    let phases = joined.lastPullTimings.withLock { $0 }
    let connection = try PostgresConnection(database)
    var copied = (rows: 0, bytes: 0)
    let copy = try seconds {
        copied = try connection.copyOut(
            "COPY (SELECT item_id, version, device_id, payload FROM lockbox_sync_items WHERE group_id = '\(group.groupID)' ORDER BY version) TO STDOUT")
    }
    // The floor of keeping them here: the same rows fetched and stored as they come, in a plain
    // SQLite table (item id as primary key; the vault's durability: WAL, synchronous=FULL, one
    // transaction), nothing opened, sealed or indexed.
    let rawPath = root + "/raw.db"
    var stored = 0
    let storeRaw = try seconds {
        let rows = try connection.executeBinary(
            "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 ORDER BY version", [.text(group.groupID)])
        let raw = try Database(path: rawPath, create: true)
        try raw.execute("CREATE TABLE records (item_id BLOB PRIMARY KEY, version INTEGER NOT NULL, payload BLOB NOT NULL)")
        try raw.writeTransaction { () throws(LockboxError) in
            let insert = try raw.statement("INSERT INTO records (item_id, version, payload) VALUES (?, ?, ?)")
            for row in rows {
                insert.reset()
                insert.bind(1, row[0] ?? [])
                insert.bind(2, row[1] ?? [])
                insert.bind(3, row[2] ?? [])
                try insert.run()
                stored += 1
            }
            insert.reset()
        }
    }
    // The same rows in a table of the vault's shape, nothing opened.
    var vaultShaped = 0
    let storeVaultShaped = try seconds { vaultShaped = try storeInVaultShape(connection, groupID: group.groupID, path: root + "/shaped.db") }
    // The design that would keep the records as they arrive (docs/SYNC.md), measured alone.
    var keptPhases = SyncGroup.KeptImportTimings()
    let kept = try seconds { keptPhases = try joined.measureKeptImport(at: root + "/kept.db") }
    let secondSync = try seconds { try joined.sync() }
    // The local floor: the same items added to a fresh vault, as the pull adds them.
    let floorVault = try machine("floor")
    let floorItems = try joined.vault.items(
        matching: Query(.genericPassword, limit: .all, returning: [.attributes, .data], synchronizable: .synchronizable))
    let vaultAdd = try seconds {
        for start in stride(from: 0, to: floorItems.count, by: 500) {
            try floorVault.add(contentsOf: Array(floorItems[start..<min(start + 500, floorItems.count)]))
        }
    }
    print("")
    print("First sync of \(items) items to a new device (pulled \(pulled); COPY read \(copied.rows) rows, \(copied.bytes / 1024) KiB):")
    row("  writer's first push of \(items) items", push)
    row("  new device's first sync (pull, open, add to its vault)", firstSync,
        String(format: "%.2fx COPY (target 3x: %@); CPU %.1f ms", firstSync / copy, firstSync <= 3 * copy ? "met" : "missed", firstProcessor * 1000))
    row("  plain COPY of the same ciphertext rows", copy)
    func inSeconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
    row("  the same rows fetched and stored raw (a plain table)", storeRaw,
        String(format: "%.2fx COPY: the floor of keeping them here (%d rows)", storeRaw / copy, stored))
    row("  the same rows in a table of the vault's shape, nothing opened", storeVaultShaped,
        String(format: "%.2fx COPY: the floor of any import into the vault's rows (%d rows)", storeVaultShaped / copy, vaultShaped))
    row("  a first sync keeping the records as they arrive (design)", kept,
        String(
            format: "%.2fx COPY: fetch %.1f, open beside store %.1f ms (%d records)", kept / copy,
            inSeconds(keptPhases.fetch) * 1000, inSeconds(keptPhases.store) * 1000, keptPhases.records))
    row("    of the sync: fetch (one query, binary rows)", inSeconds(phases.fetch))
    row("    of the sync: open every record's metadata", inSeconds(phases.open))
    row("    of the sync: check the records against the group's head", inSeconds(phases.verify))
    row("    of the sync: compare with the local state", inSeconds(phases.decide))
    row("    of the sync: vault, one transaction (values opened there)", inSeconds(phases.vault))
    row("    of the sync: local state commit", inSeconds(phases.state))
    row("    of the sync: the device's cursor in the database", inSeconds(phases.cursor))
    row("  the vault alone adding the same \(floorItems.count) items (500 a transaction)", vaultAdd,
        String(format: "sync = COPY + vault add + %.0f ms", (firstSync - copy - vaultAdd) * 1000))
    row("  new device's next sync (maps the rows it added)", secondSync)

    // 2. Ten changes among `among` items.
    let big = try machine("big")
    try fill(big, count: among, prefix: "among")
    let bigGroup = try SyncGroup.create(vault: big, database: database, passphrase: SecretBytes(utf8: "benchmark group"))
    let bigPush = try seconds { try bigGroup.sync() }
    let other = try machine("other")
    let otherGroup = try SyncGroup.join(bigGroup.groupID, vault: other, database: database, passphrase: SecretBytes(utf8: "benchmark group"))
    let otherPull = try seconds { try otherGroup.sync() }
    let otherMap = try seconds { try otherGroup.sync() }
    let idle = try seconds { try bigGroup.sync() }
    for index in stride(from: 0, to: among, by: among / 10).prefix(10) {
        var query = Query.genericPassword(service: "among-\(index).example", account: "user\(index)")
        query.synchronizable = .synchronizable
        try big.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "changed \(index)")))
    }
    var listed = 0
    let listing = try seconds { listed = try big.synchronizableChanges(since: 1).changed.count }
    let connect = try seconds { _ = try PostgresConnection(database) }
    var incremental = SyncGroup.Report()
    let phase = ProcessInfo.processInfo.environment["LOCKBOX_PERF_PHASE"]
    let pushProcessorBefore = processorSeconds()
    if phase == "incremental-push" { perf("enable\n") }
    let incrementalPush = try seconds { incremental = try bigGroup.sync() }
    if phase == "incremental-push" { perf("disable\n") }
    let pushProcessor = processorSeconds() - pushProcessorBefore
    var received = SyncGroup.Report()
    let pullProcessorBefore = processorSeconds()
    if phase == "incremental-pull" { perf("enable\n") }
    let incrementalPull = try seconds { received = try otherGroup.sync() }
    if phase == "incremental-pull" { perf("disable\n") }
    let pullProcessor = processorSeconds() - pullProcessorBefore
    let incrementalPhases = otherGroup.lastPullTimings.withLock { $0 }
    print("")
    print("Ten changed among \(among) items (pushed \(incremental.pushed), pulled \(received.pulled)):")
    row("  first push of \(among) items", bigPush)
    row("  second device's first pull of \(among) items", otherPull)
    row("  second device's next sync (maps the rows it added)", otherMap)
    row("  a sync with nothing changed", idle)
    row("  sync that pushes the 10 changes", incrementalPush, String(format: "(target < 50 ms); CPU %.1f ms", pushProcessor * 1000))
    row("  sync that pulls the 10 changes", incrementalPull, String(format: "(target < 50 ms); CPU %.1f ms", pullProcessor * 1000))
    row(
        "    of its pull: fetch, open, head, compare, vault, state",
        inSeconds(incrementalPhases.fetch + incrementalPhases.open + incrementalPhases.verify + incrementalPhases.decide + incrementalPhases.vault + incrementalPhases.state + incrementalPhases.cursor),
        String(
            format: "%.1f + %.1f + %.1f + %.1f + %.1f + %.1f ms", inSeconds(incrementalPhases.fetch) * 1000, inSeconds(incrementalPhases.open) * 1000,
            inSeconds(incrementalPhases.verify) * 1000, inSeconds(incrementalPhases.decide) * 1000, inSeconds(incrementalPhases.vault) * 1000,
            inSeconds(incrementalPhases.state + incrementalPhases.cursor) * 1000))
    row("  of which: the vault's listing of \(listed) synchronizable rows", listing)
    row("  of which: one PostgreSQL connection (SCRAM)", connect)

    // The same, pulled by the reader's vault opened anew each time (as by a new process).
    if rounds > 0 {
        print("")
        print("Ten changed among \(among) items, pulled by the reader's vault opened anew (\(rounds) rounds):")
    }
    var pulls: [Double] = []
    for round in 0..<rounds {
        for index in stride(from: round + 1, to: among, by: among / 10).prefix(10) {
            var query = Query.genericPassword(service: "among-\(index).example", account: "user\(index)")
            query.synchronizable = .synchronizable
            try big.update(matching: query, to: ItemUpdate(data: SecretBytes(utf8: "round \(round) \(index)")))
        }
        try bigGroup.sync()
        let reopened = try Vault.open(at: other.path, configuration: settings("other"))
        try reopened.unlock(passphrase: SecretBytes(utf8: "benchmark"))
        let fresh = try SyncGroup(otherGroup.groupID, vault: reopened, database: database)
        var pulled = SyncGroup.Report()
        let processorBefore = processorSeconds()
        let pull = try seconds { pulled = try fresh.sync() }
        let processor = processorSeconds() - processorBefore
        pulls.append(pull)
        let phases = fresh.lastPullTimings.withLock { $0 }
        row(
            "  round \(round + 1): sync that pulls the \(pulled.pulled) changes", pull,
            String(
                format: "CPU %.1f ms; pull: %.1f + %.1f + %.1f + %.1f + %.1f + %.1f ms", processor * 1000, inSeconds(phases.fetch) * 1000,
                inSeconds(phases.open) * 1000, inSeconds(phases.verify) * 1000, inSeconds(phases.decide) * 1000,
                inSeconds(phases.vault) * 1000, inSeconds(phases.state + phases.cursor) * 1000))
    }
    if !pulls.isEmpty {
        row("  median of the rounds", pulls.sorted()[pulls.count / 2], pulls.sorted()[pulls.count / 2] < 0.05 ? "(target < 50 ms: met)" : "(target < 50 ms: missed)")
    }
} catch {
    FileHandle.standardError.write(Data("lockbox-sync-bench: \(error)\n".utf8))
    exit(1)
}

/// The floor of any import that keeps items as rows of the vault's shape: the rows fetched as a
/// pull fetches them and inserted, in one transaction of the vault's settings (its page size,
/// WAL, `synchronous=FULL`, its log writes gathered, a page cache as large as the bulk apply
/// asks for), into a table with the vault's columns and indexes (`items`: identifier, lookup,
/// name and synchronizable-version indexes), each record's payload standing for the row's
/// sealed blobs. Nothing is opened or sealed: per record, on two other threads, a batch at a
/// time, only four keyed digests, standing for the least a record needs (its head element over
/// the payload, its lookup and name digests, its integrity element). So whatever design a new
/// device imports with, as long as its items are rows a query finds through the vault's
/// indexes, it costs at least this.
func storeInVaultShape(_ connection: PostgresConnection, groupID: String, path: String) throws -> Int {
    let rows = try connection.executeBinary(
        "SELECT item_id, version, payload FROM lockbox_sync_items WHERE group_id = $1 ORDER BY version", [.text(groupID)])
    let database = try Database(path: path, create: true, pageSize: VaultSchema.pageSize, gatheringLogWrites: true)
    try database.execute(
        """
        CREATE TABLE items (rowid INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE, item_class TEXT NOT NULL,
            accessibility TEXT NOT NULL, access_group TEXT NOT NULL, synchronizable INTEGER NOT NULL, device_id TEXT NOT NULL,
            access_control TEXT NOT NULL, primary_digest BLOB NOT NULL, lookup_digest BLOB NOT NULL, name_digest BLOB,
            wrapped_key BLOB NOT NULL, metadata BLOB NOT NULL, secret BLOB NOT NULL, format INTEGER NOT NULL,
            version INTEGER NOT NULL, bucket INTEGER NOT NULL);
        CREATE INDEX items_by_lookup ON items(lookup_digest);
        CREATE INDEX items_by_name ON items(name_digest);
        CREATE INDEX items_synchronizable ON items(version) WHERE synchronizable = 1;
        PRAGMA cache_size = -\(min(rows.count * 3, 64 * 1024));
        """)
    let key = Crypto.generateKey()
    /// Digests made on another thread for a range of rows; read only after `finished`.
    final class Digested: @unchecked Sendable {
        let range: Range<Int>
        var digests: [(element: [UInt8], lookup: [UInt8], name: [UInt8], integrity: [UInt8])] = []
        let finished = DispatchSemaphore(value: 0)
        init(_ range: Range<Int>) { self.range = range }
    }
    var inserted = 0
    try database.writeTransaction { () throws(LockboxError) in
        let insert = try database.statement(
            """
            INSERT INTO items (id, item_class, accessibility, access_group, synchronizable, device_id, access_control,
                primary_digest, lookup_digest, name_digest, wrapped_key, metadata, secret, format, version, bucket)
            VALUES (?, 'genp', 'afterFirstUnlock', 'lockbox.default', 1, '', '', ?, ?, ?, ?, ?, X'', 4, ?, ?)
            """)
        defer { insert.reset() }
        var inFlight: [Digested] = []
        var next = 0
        func digestAhead() {
            while inFlight.count < 2 && next < rows.count {
                let batch = Digested(next..<min(next + 128, rows.count))
                DispatchQueue.global(qos: .userInitiated).async {
                    for index in batch.range {
                        let element = Crypto.keyedDigest(rows[index][2] ?? [], key: key)
                        let lookup = Crypto.keyedDigest(rows[index][0] ?? [], key: key)
                        batch.digests.append((element, lookup, Crypto.keyedDigest(lookup, key: key), Crypto.keyedDigest(element, key: key)))
                    }
                    batch.finished.signal()
                }
                inFlight.append(batch)
                next = batch.range.upperBound
            }
        }
        defer { for batch in inFlight { batch.finished.wait() } }
        digestAhead()
        while !inFlight.isEmpty {
            let batch = inFlight.removeFirst()
            batch.finished.wait()
            digestAhead()
            for (offset, digests) in batch.digests.enumerated() {
                let record = rows[batch.range.lowerBound + offset]
                insert.reset()
                insert.bind(1, Vault.newRowIdentifier(generation: inserted))
                insert.bind(2, digests.element)
                insert.bind(3, digests.lookup)
                insert.bind(4, digests.name)
                insert.bind(5, record[0] ?? [])
                insert.bind(6, record[2] ?? [])
                insert.bind(7, inserted)
                insert.bind(8, Int(digests.lookup[0]))
                try insert.run()
                inserted += 1
            }
        }
    }
    return inserted
}
