import Foundation
import Lockbox
import LockboxTestSupport
import Testing
import VaultStorage

@testable import LockboxVault

/// The vault's connections hand a commit's write-ahead log frames to the file in one write
/// (CWriteAheadBuffer). What they write must be exactly what SQLite's own VFS writes: other
/// connections (with or without the gathering VFS) read every committed row and no rolled-back
/// one, transactions larger than the buffer and log restarts after checkpoints come out whole,
/// and the file passes SQLite's integrity check.
@Suite("Write-ahead log writing")
struct WriteAheadLogWritingTests {
    static func open(_ path: String, gathering: Bool, create: Bool = false) throws(LockboxError) -> Database {
        try Database(path: path, create: create, gatheringLogWrites: gathering)
    }

    static func count(_ database: Database) throws(LockboxError) -> Int {
        try database.firstRow("SELECT count(*) FROM t") { $0.integer(0) ?? -1 } ?? -1
    }

    static func insert(_ database: Database, _ key: Int, size: Int) throws(LockboxError) {
        let statement = try database.statement("INSERT INTO t (k, v) VALUES (?, ?)")
        statement.bind(1, key)
        statement.bind(2, [UInt8](repeating: UInt8(truncatingIfNeeded: key), count: size))
        try statement.run()
    }

    @Test("Commits of every size are read back by a plain SQLite connection; a rollback leaves nothing")
    func commitsAndRollbacks() throws {
        let directory = TemporaryDirectory("lockbox-wal")
        let path = directory.file("log.sqlite")
        let writer = try Self.open(path, gathering: true, create: true)
        try writer.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        let plain = try Self.open(path, gathering: false)
        #expect(writer.vfsName == "lockbox-wal-buffer")
        #expect(plain.vfsName == "unix")

        // Small commits, one per row.
        for key in 0..<50 { try writer.writeTransaction { () throws(LockboxError) in try Self.insert(writer, key, size: 100) } }
        #expect(try Self.count(plain) == 50)
        // One commit of about 1 MiB: many times the buffer, written as it fills.
        try writer.writeTransaction { () throws(LockboxError) in
            for key in 50..<300 { try Self.insert(writer, key, size: 4_000) }
        }
        #expect(try Self.count(plain) == 300)
        // A rolled-back transaction leaves no row behind, in either connection.
        #expect(throws: LockboxError.self) {
            try writer.writeTransaction { () throws(LockboxError) in
                for key in 300..<400 { try Self.insert(writer, key, size: 4_000) }
                throw LockboxError(.param, "abandoned on purpose")
            }
        }
        #expect(try Self.count(writer) == 300)
        #expect(try Self.count(plain) == 300)
        // The bytes are the ones written.
        let sample = try plain.firstRow("SELECT v FROM t WHERE k = 123") { $0.blob(0) } ?? nil
        #expect(sample == [UInt8](repeating: 123, count: 4_000))
        #expect(try plain.integrityCheck() == "ok")
    }

    @Test("Two gathering connections take turns through checkpoints and log restarts")
    func connectionsTakingTurns() throws {
        let directory = TemporaryDirectory("lockbox-wal")
        let path = directory.file("log.sqlite")
        let first = try Self.open(path, gathering: true, create: true)
        try first.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        let second = try Self.open(path, gathering: true)
        var key = 0
        for round in 0..<40 {
            let database = round % 2 == 0 ? first : second
            try database.writeTransaction { () throws(LockboxError) in
                for _ in 0..<5 {
                    try Self.insert(database, key, size: 700)
                    key += 1
                }
            }
            // Every few rounds the log is moved into the file and truncated, so the next
            // commit starts the log again at its header.
            if round % 7 == 6 { database.truncateWriteAheadLog() }
            #expect(try Self.count(round % 2 == 0 ? second : first) == key)
        }
        #expect(try first.integrityCheck() == "ok")
        // A plain connection opened afterwards, from the file and what is left of the log.
        let plain = try Self.open(path, gathering: false)
        #expect(try Self.count(plain) == key)
        #expect(try plain.integrityCheck() == "ok")
    }

    @Test("A new vault gathers its log writes and uses the vault's page size; its items survive a reopen")
    func newVault() throws {
        let fixture = try VaultFixture()
        for index in 0..<20 {
            try fixture.vault.add(.genericPassword(service: "wal.example", account: "user\(index)", data: SecretBytes(utf8: "value-\(index)")))
        }
        let (pageSize, vfs) = try fixture.vault.withDatabase { database throws(LockboxError) in
            (try database.firstRow("PRAGMA page_size") { $0.integer(0) } ?? nil, database.vfsName)
        }
        #expect(pageSize == VaultSchema.pageSize)
        #expect(vfs == "lockbox-wal-buffer")
        #expect(try fixture.reopen().withDatabase { database throws(LockboxError) in database.vfsName } == "lockbox-wal-buffer")
        let reopened = try fixture.reopen()
        for index in 0..<20 {
            #expect(
                try reopened.data(matching: .genericPassword(service: "wal.example", account: "user\(index)"))
                    == SecretBytes(utf8: "value-\(index)"))
        }
        let plain = try Self.open(fixture.path, gathering: false)
        #expect(try plain.integrityCheck() == "ok")
    }
}
