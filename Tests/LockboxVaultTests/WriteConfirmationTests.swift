import Foundation
import LockboxCore
import LockboxTestSupport
import Testing
import VaultStorage

@testable import LockboxVault

/// A write confirms the integrity record through SQLite's change counter when this handle was
/// the last to commit; whatever another connection commits in between must still be seen.
@Suite("Writes from several handles")
struct WriteConfirmationTests {
    func item(_ account: String) -> Item {
        .genericPassword(service: "svc.write", account: account, data: SecretBytes(utf8: "value-\(account)"))
    }

    @Test("two handles writing in turn keep one integrity record that verifies, and each reads the other's items")
    func interleavedWriters_keepTheRecordExact() throws {
        let fixture = try VaultFixture()
        let other = try fixture.reopen()
        // Each handle writes several times in a row (its own commits: the counter path), then
        // the other writes (the statement path must notice it).
        for round in 0..<6 {
            for step in 0..<3 { try fixture.vault.add(item("a-\(round)-\(step)")) }
            for step in 0..<3 { try other.add(item("b-\(round)-\(step)")) }
            try fixture.vault.update(
                matching: .genericPassword(service: "svc.write", account: "b-\(round)-0"),
                to: ItemUpdate(data: SecretBytes(utf8: "changed-by-a-\(round)")))
            try other.delete(matching: .genericPassword(service: "svc.write", account: "a-\(round)-1"))
        }
        let report = try Vault.verify(at: fixture.path, configuration: fixture.vault.configuration)
        #expect(report.problems.isEmpty, "\(report.problems)")
        #expect(report.items == 6 * 5)
        for round in 0..<6 {
            #expect(
                try other.data(matching: .genericPassword(service: "svc.write", account: "b-\(round)-0")) == SecretBytes(utf8: "changed-by-a-\(round)"))
            #expect(try fixture.vault.data(matching: .genericPassword(service: "svc.write", account: "b-\(round)-2")) == SecretBytes(utf8: "value-b-\(round)-2"))
            #expect(status { _ = try fixture.vault.data(matching: .genericPassword(service: "svc.write", account: "a-\(round)-1")) } == -25300)
        }
        // A third handle opened now verifies every bucket it reads.
        let third = try fixture.reopen()
        #expect(try third.data(matching: .genericPassword(service: "svc.write", account: "a-5-2")) == SecretBytes(utf8: "value-a-5-2"))
    }

    @Test("a row edited by another connection between two writes of this handle is refused at the next read")
    func editBetweenOwnWrites_isRefused() throws {
        let fixture = try VaultFixture()
        try fixture.vault.add(item("first"))
        try fixture.vault.add(item("second"))
        let database = try Database(path: fixture.path, create: false)
        try database.execute("UPDATE items SET version = version + 1 WHERE rowid = (SELECT min(rowid) FROM items)")
        // The next write sees the change counter moved: it re-reads the record, and the read
        // that follows checks the edited row's bucket.
        try fixture.vault.add(item("third"))
        #expect(status { _ = try fixture.vault.data(matching: .genericPassword(service: "svc.write", account: "first")) } == -26275)
    }

    @Test("identifiers of later writes sort after earlier ones and begin with the writing generation")
    func identifiers_followTheGeneration() throws {
        let fixture = try VaultFixture()
        var references: [Data] = []
        for index in 0..<5 {
            try fixture.vault.add(item("ordered-\(index)"))
            let found = try fixture.vault.items(
                matching: Query(.genericPassword, attributes: ItemAttributes(service: "svc.write", account: "ordered-\(index)"),
                    returning: [.attributes, .persistentReference]))
            let reference = try #require(found.first?.persistentReference)
            #expect(reference.count == 16)
            references.append(reference)
        }
        #expect(references == references.sorted { $0.lexicographicallyPrecedes($1) })
        let generations = references.map { $0.prefix(8).reduce(0) { $0 << 8 | Int($1) } }
        #expect(Set(generations).count == 5)
        #expect(generations.allSatisfy { $0 > 0 && $0 < 100 })
    }
}
