#if !canImport(Darwin)
import Foundation
import Lockbox
import LockboxKeys

/// A private key inside `lockboxd`: `SecKey` calls on it go to the broker, which signs and
/// decrypts there; the private key never reaches this process. It is found by its application
/// tag and label in the caller's access groups.
struct BrokeredKey {
    let store: BrokerStore
    let algorithm: KeyAlgorithm
    let purposes: KeyPurposes
    let publicKey: PublicKey
    let applicationTag: Data
    let label: String?
    let persistentReference: Data?

    /// `SecKeyCreateRandomKey` with `kSecAttrIsPermanent` through the broker: a
    /// non-extractable key made inside it.
    static func generate(_ request: KeyRequest, in store: BrokerStore) throws(LockboxError) -> BrokeredKey {
        let specification = request.specification
        guard let tag = specification.applicationTag else {
            throw LockboxError(.param, "A key made through lockboxd is found by its tag: give kSecAttrApplicationTag.")
        }
        guard specification.accessControl == nil else {
            throw LockboxError(
                .unimplemented, "Access-controlled keys are not made through lockboxd in this release; make the key without kSecAttrAccessControl.")
        }
        guard !specification.isExtractable else {
            throw LockboxError(.param, "A key made through lockboxd never leaves it: kSecAttrIsExtractable must not be true.")
        }
        let der = try store.generateKey(
            algorithm: specification.algorithm.rawValue, purposes: specification.purposes.rawValue, applicationTag: tag,
            label: specification.label, accessGroup: specification.accessGroup)
        return BrokeredKey(
            store: store, algorithm: specification.algorithm, purposes: specification.purposes,
            publicKey: try PublicKey(derRepresentation: der), applicationTag: tag, label: specification.label, persistentReference: nil)
    }

    /// The asymmetric managed keys among `items` (found through the broker, attributes only).
    static func keys(in items: [Item], store: BrokerStore) -> [BrokeredKey] {
        items.compactMap { item in
            guard let description = KeyItemDescription(item), let publicKey = description.publicKey,
                let tag = item.attributes.applicationTag
            else { return nil }
            return BrokeredKey(
                store: store, algorithm: description.algorithm, purposes: description.purposes, publicKey: publicKey,
                applicationTag: tag, label: item.attributes.label, persistentReference: item.persistentReference)
        }
    }

    func sign(_ message: Data) throws(LockboxError) -> Data {
        try store.sign(message, applicationTag: applicationTag, label: label)
    }

    func decrypt(_ message: Data, algorithm: SecKeyAlgorithm, context: AuthenticationContext?) throws(LockboxError) -> SecretBytes {
        try store.decrypt(message, scheme: algorithm.rawValue, applicationTag: applicationTag, label: label, context: context)
    }
}
#endif
