import LockboxCore
import VaultStorage

/// One row of `integrity_groups` as stored: what the tests that read the integrity record,
/// edit it as an attacker with the file would, and put it back, handle.
struct IntegrityGroupRow: Equatable {
    var id: Int
    var accumulators: [UInt8]
    var generation: Int
    var mac: [UInt8]
    var alwaysMAC: [UInt8]

    /// Every group row, by id.
    static func all(in database: Database) throws(LockboxError) -> [IntegrityGroupRow] {
        let statement = try database.statement("SELECT id, accumulators, generation, mac, always_mac FROM integrity_groups ORDER BY id")
        defer { statement.reset() }
        var rows: [IntegrityGroupRow] = []
        while try statement.step() {
            rows.append(
                IntegrityGroupRow(
                    id: statement.integer(0) ?? -1, accumulators: statement.blob(1) ?? [], generation: statement.integer(2) ?? -1,
                    mac: statement.blob(3) ?? [], alwaysMAC: statement.blob(4) ?? []))
        }
        return rows
    }

    /// Writes this row over the stored one of its id.
    func put(into database: Database) throws(LockboxError) {
        let update = try database.statement("UPDATE integrity_groups SET accumulators = ?, generation = ?, mac = ?, always_mac = ? WHERE id = ?")
        defer { update.reset() }
        update.bind(1, accumulators)
        update.bind(2, generation)
        update.bind(3, mac)
        update.bind(4, alwaysMAC)
        update.bind(5, id)
        try update.run()
    }
}
