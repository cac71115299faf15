import Foundation
import Lockbox
import VaultCrypto
import VaultStorage

#if canImport(Glibc)
import Glibc
#endif

// Prints p50/p99 latencies of the vault's add, find (with data), update and delete at 1,000
// and 100,000 items, next to the floor: raw SQLite with the same durability settings and one
// XChaCha20-Poly1305 open per read. Run with `swift run -c release lockbox-bench`.
//
//   lockbox-bench [--sizes 1000,100000] [--operations 1000] [--rounds 3] [--markdown]
//
// Each size's vault and floor are timed R times over (`--rounds R`, 3 unless told; new items
// each round), and a last table gives each operation's median p50 ratio, the rounds' range and
// the verdict: one round's ratio moves by about a tenth between runs on a shared machine, so a
// verdict is given on the median of the rounds (on the round itself with `--rounds 1`).

struct Options {
    var sizes = [1_000, 100_000]
    var operations = 1_000
    var rounds = 3
    var markdown = false
    /// Only these operations are timed (the others still run once to set up); for profiling.
    var only: Set<String> = ["add", "find", "update", "delete"]

    init(_ arguments: [String]) {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--sizes": sizes = (iterator.next() ?? "").split(separator: ",").compactMap { Int($0) }
            case "--operations": operations = Int(iterator.next() ?? "") ?? operations
            case "--rounds": rounds = max(1, Int(iterator.next() ?? "") ?? rounds)
            case "--markdown": markdown = true
            case "--only": only = Set((iterator.next() ?? "").split(separator: ",").map(String.init))
            default:
                FileHandle.standardError.write(Data("usage: lockbox-bench [--sizes 1000,100000] [--operations N] [--rounds R] [--only add,find,update,delete] [--markdown]\n".utf8))
                exit(64)
            }
        }
    }
}

func now() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

/// The calling thread's CPU time (user and system), which waiting for the disk does not count.
func threadCPUTime() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
    return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
}

struct Sample {
    var nanoseconds: [UInt64] = []
    /// CPU time per operation: what the operation itself costs, apart from the disk's syncs,
    /// which another process's writes can stretch on a shared machine.
    var cpuNanoseconds: [UInt64] = []

    mutating func measure(_ body: () throws -> Void) rethrows {
        let start = now()
        let cpuStart = threadCPUTime()
        try body()
        cpuNanoseconds.append(threadCPUTime() - cpuStart)
        nanoseconds.append(now() - start)
    }

    func percentile(_ fraction: Double) -> Double { Self.percentile(nanoseconds, fraction) }
    func cpuPercentile(_ fraction: Double) -> Double { Self.percentile(cpuNanoseconds, fraction) }

    static func percentile(_ nanoseconds: [UInt64], _ fraction: Double) -> Double {
        let sorted = nanoseconds.sorted()
        guard !sorted.isEmpty else { return .nan }
        let index = min(sorted.count - 1, Int((Double(sorted.count) * fraction).rounded(.down)))
        return Double(sorted[index]) / 1_000
    }
}

struct Row {
    var size: Int
    var operation: String
    var round: Int
    var vault: Sample
    var floor: Sample

    var ratio: Double { vault.percentile(0.5) / floor.percentile(0.5) }
}

func temporaryDirectory() -> String {
    var template = Array("/tmp/lockbox-bench-XXXXXX".utf8CString)
    let created = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    precondition(created != nil)
    return String(cString: template.withUnsafeBufferPointer { $0.baseAddress! })
}

func value(_ index: Int) -> SecretBytes {
    SecretBytes(utf8: "token-value-\(index)-padding-to-look-like-a-real-token-0123456789")
}

/// One side of the comparison: the four operations on item `index` (adds and updates and
/// deletes work on "new<index>", finds on "user<index>").
struct Subject {
    var add: (Int) throws -> Void
    var find: (Int) throws -> Void
    var update: (Int) throws -> Void
    var delete: (Int) throws -> Void
    var close: () -> Void = {}
}

/// The vault, populated with `size` items in batches.
func vaultSubject(size: Int, directory: String) throws -> Subject {
    var configuration = Vault.Configuration()
    configuration.keyDerivation = .interactive
    let vault = try Vault.create(at: directory + "/vault/bench.lockbox", passphrase: SecretBytes(utf8: "bench"), configuration: configuration)
    var batch: [Item] = []
    for index in 0..<size {
        batch.append(.genericPassword(service: "bench.example.com", account: "user\(index)", data: value(index)))
        if batch.count == 5_000 {
            try vault.add(contentsOf: batch)
            batch.removeAll(keepingCapacity: true)
        }
    }
    try vault.add(contentsOf: batch)
    return Subject(
        add: { index in try vault.add(.genericPassword(service: "bench.example.com", account: "new\(index)", data: value(index))) },
        find: { index in _ = try vault.data(matching: .genericPassword(service: "bench.example.com", account: "user\(index)")) },
        update: { index in
            try vault.update(matching: .genericPassword(service: "bench.example.com", account: "new\(index)"), to: ItemUpdate(data: value(index + 1)))
        },
        delete: { index in try vault.delete(matching: .genericPassword(service: "bench.example.com", account: "new\(index)")) },
        close: { vault.lockAll() })
}

/// The floor: one table keyed by a digest, the same pragmas, one AEAD open per read.
func floorSubject(size: Int, directory: String) throws -> Subject {
    let database = try Database(path: directory + "/floor.sqlite", create: true)
    try database.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k BLOB NOT NULL UNIQUE, v BLOB NOT NULL)")
    let key = Crypto.generateKey()
    let indexKey = Crypto.generateKey()
    func digest(_ name: String) -> [UInt8] { Crypto.keyedDigest(Array(name.utf8), key: indexKey) }
    func insert(_ name: String, _ index: Int) throws {
        let statement = try database.statement("INSERT INTO t (k, v) VALUES (?, ?)")
        statement.bind(1, digest(name))
        statement.bind(2, Crypto.seal(value(index), key: key, associatedData: []))
        try statement.run()
    }
    var written = 0
    while written < size {
        try database.writeTransaction { () throws(LockboxError) in
            for index in written..<min(size, written + 5_000) { try? insert("user\(index)", index) }
        }
        written += 5_000
    }
    return Subject(
        add: { index in try insert("new\(index)", index) },
        find: { index in
            let statement = try database.statement("SELECT v FROM t WHERE k = ?")
            statement.bind(1, digest("user\(index)"))
            guard try statement.step(), let box = statement.blob(0) else { fatalError("floor row missing") }
            _ = try Crypto.open(box, key: key, associatedData: [])
            database.resetStatements()
        },
        update: { index in
            let statement = try database.statement("UPDATE t SET v = ? WHERE k = ?")
            statement.bind(1, Crypto.seal(value(index + 1), key: key, associatedData: []))
            statement.bind(2, digest("new\(index)"))
            try statement.run()
        },
        delete: { index in
            let statement = try database.statement("DELETE FROM t WHERE k = ?")
            statement.bind(1, digest("new\(index)"))
            try statement.run()
        })
}

/// Times each operation on both sides, alternating vault and floor operation by operation, so
/// that the disk's and the machine's momentary state (another process's fsync, a busy core)
/// fall on both alike. Updates and deletes work on added items, so the adds run as often as
/// either of them.
/// `first` numbers the round's new items (adds, updates and deletes use the same ones).
func compare(size: Int, operations: Int, round: Int, vault: Subject, floor: Subject) throws -> [Row] {
    let first = round * operations
    func count(_ name: String) -> Int { options.only.contains(name) ? operations : 0 }
    var generator = SystemRandomNumberGenerator()
    var rows: [Row] = []
    let plan: [(String, Int, KeyPath<Subject, (Int) throws -> Void>, (Int) -> Int)] = [
        ("add", max(count("add"), count("update"), count("delete")), \.add, { first + $0 }),
        ("find", count("find"), \.find, { _ in Int.random(in: 0..<size, using: &generator) }),
        ("update", count("update"), \.update, { first + $0 }),
        ("delete", count("delete"), \.delete, { first + $0 }),
    ]
    for (name, runs, operation, index) in plan {
        var vaultSample = Sample()
        var floorSample = Sample()
        for run in 0..<runs {
            let item = index(run)
            try vaultSample.measure { try vault[keyPath: operation](item) }
            try floorSample.measure { try floor[keyPath: operation](item) }
        }
        if options.only.contains(name) { rows.append(Row(size: size, operation: name, round: round, vault: vaultSample, floor: floorSample)) }
    }
    return rows
}

let options = Options(Array(CommandLine.arguments.dropFirst()))
var rows: [Row] = []
for size in options.sizes {
    let directory = temporaryDirectory()
    defer { try? FileManager.default.removeItem(atPath: directory) }
    do {
        FileHandle.standardError.write(Data("lockbox-bench: \(size) items...\n".utf8))
        let vault = try vaultSubject(size: size, directory: directory)
        defer { vault.close() }
        let floor = try floorSubject(size: size, directory: directory)
        for round in 0..<options.rounds {
            rows += try compare(size: size, operations: options.operations, round: round, vault: vault, floor: floor)
        }
    } catch {
        FileHandle.standardError.write(Data("lockbox-bench: \(error)\n".utf8))
        exit(1)
    }
}

func format(_ microseconds: Double) -> String { String(format: "%.1f", microseconds) }

/// The vault's targets, as a ratio of the floor's p50: a durable add within 1.5x a raw durable
/// insert, a read within 2x SQLite and one AEAD open.
let targets: [String: Double] = ["add": 1.5, "find": 2.0]

func verdict(_ operation: String, _ ratio: Double) -> String {
    guard let target = targets[operation] else { return "" }
    return String(format: "<= %.1fx %@", target, ratio <= target ? "met" : "MISSED")
}

/// A row's last column: its own verdict with one round; with several, the round's number (the
/// verdict is the rounds' median's, in the last table).
func lastColumn(_ row: Row) -> String {
    options.rounds > 1 ? "round \(row.round + 1) of \(options.rounds)" : verdict(row.operation, row.ratio)
}

/// The heading of the rows' last column.
let lastColumnHeading = options.rounds > 1 ? "round" : "target"

if options.markdown {
    print("| items | operation | vault p50 (µs) | vault p99 (µs) | floor p50 (µs) | floor p99 (µs) | p50 ratio | \(lastColumnHeading) | CPU p50 vault / floor (µs) |")
    print("|---:|---|---:|---:|---:|---:|---:|---|---|")
    for row in rows {
        print(
            "| \(row.size) | \(row.operation) | \(format(row.vault.percentile(0.5))) | \(format(row.vault.percentile(0.99))) | "
                + "\(format(row.floor.percentile(0.5))) | \(format(row.floor.percentile(0.99))) | "
                + String(format: "%.2fx", row.vault.percentile(0.5) / row.floor.percentile(0.5)) + " | \(lastColumn(row)) | "
                + "\(format(row.vault.cpuPercentile(0.5))) / \(format(row.floor.cpuPercentile(0.5))) |")
    }
} else {
    print(
        "items      op      vault p50   vault p99   floor p50   floor p99   p50 ratio   "
            + lastColumnHeading.padding(toLength: 17, withPad: " ", startingAt: 0) + "CPU p50 vault / floor   (microseconds)")
    for row in rows {
        print(
            String(
                format: "%-10d %-7@ %9.1f   %9.1f   %9.1f   %9.1f   %7.2fx   %-16@ %7.1f / %-7.1f", row.size, row.operation as NSString,
                row.vault.percentile(0.5), row.vault.percentile(0.99), row.floor.percentile(0.5),
                row.floor.percentile(0.99), row.vault.percentile(0.5) / row.floor.percentile(0.5), lastColumn(row) as NSString,
                row.vault.cpuPercentile(0.5), row.floor.cpuPercentile(0.5)))
    }
}
if options.rounds > 1 {
    // Per size and operation, in the order measured: the median of the rounds' p50 ratios.
    var measured: [(size: Int, operation: String, ratios: [Double])] = []
    for row in rows {
        if let index = measured.firstIndex(where: { $0.size == row.size && $0.operation == row.operation }) {
            measured[index].ratios.append(row.ratio)
        } else {
            measured.append((row.size, row.operation, [row.ratio]))
        }
    }
    print("")
    print("over \(options.rounds) rounds:")
    print("items      op      median p50 ratio   range of rounds     target")
    for (size, operation, ratios) in measured {
        let sorted = ratios.sorted()
        let median = sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
        print(
            String(format: "%-10d ", size) + operation.padding(toLength: 8, withPad: " ", startingAt: 0)
                + String(format: "%13.2fx      %.2fx - %.2fx     ", median, sorted.first!, sorted.last!) + verdict(operation, median))
    }
}
if let small = rows.first(where: { $0.operation == "find" }), let large = rows.last(where: { $0.operation == "find" }), options.sizes.count > 1 {
    print(String(format: "find p50 growth from %d to %d items: %.2fx", small.size, large.size, large.vault.percentile(0.5) / small.vault.percentile(0.5)))
}
