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
//   lockbox-bench [--sizes 1000,100000] [--operations 1000] [--markdown]

struct Options {
    var sizes = [1_000, 100_000]
    var operations = 1_000
    var markdown = false
    /// Only these operations are timed (the others still run once to set up); for profiling.
    var only: Set<String> = ["add", "find", "update", "delete"]

    init(_ arguments: [String]) {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--sizes": sizes = (iterator.next() ?? "").split(separator: ",").compactMap { Int($0) }
            case "--operations": operations = Int(iterator.next() ?? "") ?? operations
            case "--markdown": markdown = true
            case "--only": only = Set((iterator.next() ?? "").split(separator: ",").map(String.init))
            default:
                FileHandle.standardError.write(Data("usage: lockbox-bench [--sizes 1000,100000] [--operations N] [--only add,find,update,delete] [--markdown]\n".utf8))
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

struct Sample {
    var nanoseconds: [UInt64] = []

    mutating func measure(_ body: () throws -> Void) rethrows {
        let start = now()
        try body()
        nanoseconds.append(now() - start)
    }

    func percentile(_ fraction: Double) -> Double {
        let sorted = nanoseconds.sorted()
        guard !sorted.isEmpty else { return .nan }
        let index = min(sorted.count - 1, Int((Double(sorted.count) * fraction).rounded(.down)))
        return Double(sorted[index]) / 1_000
    }
}

struct Row {
    var size: Int
    var operation: String
    var vault: Sample
    var floor: Sample
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

/// How many times each operation runs: `operations` for the timed ones; updates and deletes
/// work on added items, so the adds run as often as either of them.
func counts(_ operations: Int) -> (add: Int, find: Int, update: Int, delete: Int) {
    func count(_ name: String) -> Int { options.only.contains(name) ? operations : 0 }
    return (max(count("add"), count("update"), count("delete")), count("find"), count("update"), count("delete"))
}

/// The vault: populate `size` items in batches, then time single operations on top.
func benchmarkVault(size: Int, operations: Int, directory: String) throws -> [String: Sample] {
    var configuration = Vault.Configuration()
    configuration.keyDerivation = .interactive
    let vault = try Vault.create(at: directory + "/vault/bench.lockbox", passphrase: SecretBytes(utf8: "bench"), configuration: configuration)
    defer { vault.lockAll() }
    var batch: [Item] = []
    for index in 0..<size {
        batch.append(.genericPassword(service: "bench.example.com", account: "user\(index)", data: value(index)))
        if batch.count == 5_000 {
            try vault.add(contentsOf: batch)
            batch.removeAll(keepingCapacity: true)
        }
    }
    try vault.add(contentsOf: batch)

    var samples: [String: Sample] = [:]
    var add = Sample()
    for index in 0..<counts(operations).add {
        let item = Item.genericPassword(service: "bench.example.com", account: "new\(index)", data: value(index))
        try add.measure { try vault.add(item) }
    }
    samples["add"] = add
    var find = Sample()
    var generator = SystemRandomNumberGenerator()
    for _ in 0..<counts(operations).find {
        let query = Query.genericPassword(service: "bench.example.com", account: "user\(Int.random(in: 0..<size, using: &generator))")
        try find.measure { _ = try vault.data(matching: query) }
    }
    samples["find"] = find
    var update = Sample()
    for index in 0..<counts(operations).update {
        let query = Query.genericPassword(service: "bench.example.com", account: "new\(index)")
        let change = ItemUpdate(data: value(index + 1))
        try update.measure { try vault.update(matching: query, to: change) }
    }
    samples["update"] = update
    var delete = Sample()
    for index in 0..<counts(operations).delete {
        let query = Query.genericPassword(service: "bench.example.com", account: "new\(index)")
        try delete.measure { try vault.delete(matching: query) }
    }
    samples["delete"] = delete
    return samples
}

/// The floor: one table keyed by a digest, the same pragmas, one AEAD open per read.
func benchmarkFloor(size: Int, operations: Int, directory: String) throws -> [String: Sample] {
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
    var samples: [String: Sample] = [:]
    var add = Sample()
    for index in 0..<counts(operations).add {
        try add.measure { try insert("new\(index)", index) }
    }
    samples["add"] = add
    var find = Sample()
    var generator = SystemRandomNumberGenerator()
    for _ in 0..<counts(operations).find {
        let name = "user\(Int.random(in: 0..<size, using: &generator))"
        try find.measure {
            let statement = try database.statement("SELECT v FROM t WHERE k = ?")
            statement.bind(1, digest(name))
            guard try statement.step(), let box = statement.blob(0) else { fatalError("floor row missing") }
            _ = try Crypto.open(box, key: key, associatedData: [])
            database.resetStatements()
        }
    }
    samples["find"] = find
    var update = Sample()
    for index in 0..<counts(operations).update {
        try update.measure {
            let statement = try database.statement("UPDATE t SET v = ? WHERE k = ?")
            statement.bind(1, Crypto.seal(value(index + 1), key: key, associatedData: []))
            statement.bind(2, digest("new\(index)"))
            try statement.run()
        }
    }
    samples["update"] = update
    var delete = Sample()
    for index in 0..<counts(operations).delete {
        try delete.measure {
            let statement = try database.statement("DELETE FROM t WHERE k = ?")
            statement.bind(1, digest("new\(index)"))
            try statement.run()
        }
    }
    samples["delete"] = delete
    return samples
}

let options = Options(Array(CommandLine.arguments.dropFirst()))
var rows: [Row] = []
for size in options.sizes {
    let directory = temporaryDirectory()
    defer { try? FileManager.default.removeItem(atPath: directory) }
    do {
        FileHandle.standardError.write(Data("lockbox-bench: \(size) items...\n".utf8))
        let vault = try benchmarkVault(size: size, operations: options.operations, directory: directory)
        let floor = try benchmarkFloor(size: size, operations: options.operations, directory: directory)
        for operation in ["add", "find", "update", "delete"] where options.only.contains(operation) {
            rows.append(Row(size: size, operation: operation, vault: vault[operation]!, floor: floor[operation]!))
        }
    } catch {
        FileHandle.standardError.write(Data("lockbox-bench: \(error)\n".utf8))
        exit(1)
    }
}

func format(_ microseconds: Double) -> String { String(format: "%.1f", microseconds) }

if options.markdown {
    print("| items | operation | vault p50 (µs) | vault p99 (µs) | floor p50 (µs) | floor p99 (µs) | p50 ratio |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for row in rows {
        print(
            "| \(row.size) | \(row.operation) | \(format(row.vault.percentile(0.5))) | \(format(row.vault.percentile(0.99))) | "
                + "\(format(row.floor.percentile(0.5))) | \(format(row.floor.percentile(0.99))) | "
                + String(format: "%.2fx", row.vault.percentile(0.5) / row.floor.percentile(0.5)) + " |")
    }
} else {
    print("items      op      vault p50   vault p99   floor p50   floor p99   p50 ratio   (microseconds)")
    for row in rows {
        print(
            String(
                format: "%-10d %-7@ %9.1f   %9.1f   %9.1f   %9.1f   %7.2fx", row.size, row.operation as NSString,
                row.vault.percentile(0.5), row.vault.percentile(0.99), row.floor.percentile(0.5),
                row.floor.percentile(0.99), row.vault.percentile(0.5) / row.floor.percentile(0.5)))
    }
}
if let small = rows.first(where: { $0.operation == "find" }), let large = rows.last(where: { $0.operation == "find" }), options.sizes.count > 1 {
    print(String(format: "find p50 growth from %d to %d items: %.2fx", small.size, large.size, large.vault.percentile(0.5) / small.vault.percentile(0.5)))
}
