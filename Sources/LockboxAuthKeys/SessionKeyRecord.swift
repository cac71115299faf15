import Foundation
import LockboxAuth
import LockboxCore

/// The record naming which of a session's DPoP keys its tokens are bound to: a generic password
/// of `service`, account ``CredentialKey/storageAccount``, whose value is public (a thumbprint
/// or a key's label), kept beside the keys by both DPoP key stores.
struct SessionKeyRecord {
    let service: String
    let session: CredentialKey
    let store: AsyncItemStore

    /// The recorded value; nil when there is no record.
    func read() async throws(LockboxError) -> String? {
        do {
            let value = try await store.data(matching: query)
            return value.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        } catch LockboxError.itemNotFound {
            return nil
        }
    }

    /// Records `value`, replacing what was recorded.
    func write(_ value: String) async throws(LockboxError) {
        let record = SecretBytes(utf8: value)
        do {
            try await store.update(matching: query, to: ItemUpdate(data: record))
        } catch LockboxError.itemNotFound {
            try await store.add(
                Item.genericPassword(
                    service: service, account: session.storageAccount, data: record, accessibility: .afterFirstUnlockThisDeviceOnly,
                    label: "DPoP key of \(session)"))
        }
    }

    /// Removes the record; no error when there is none.
    func delete() async throws(LockboxError) {
        do {
            try await store.delete(matching: query)
        } catch LockboxError.itemNotFound {}
    }

    private var query: Query { Query.genericPassword(service: service, account: session.storageAccount) }
}
