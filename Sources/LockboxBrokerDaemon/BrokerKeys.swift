import FoundationEssentials
import KeyCrypto
import Lockbox
import LockboxBroker
import LockboxKeys
import Synchronization

/// The key operations `lockboxd` serves: managed keys made and used inside the broker. Only
/// public keys and results (signatures, decrypted data) leave it.
final class BrokerKeys: BrokerKeyOperations {
    private let store = Mutex<SoftwareKeyStore?>(nil)
    static let malformed = LockboxError(.param, "The key request is malformed; it was refused and changed nothing.")

    private func keyStore(_ vault: Vault) -> SoftwareKeyStore {
        store.withLock { store in
            if let store { return store }
            let made = SoftwareKeyStore(vault: vault)
            store = made
            return made
        }
    }

    func handle(
        _ operation: BrokerProtocol.Operation, arguments: inout FieldDecoder, grant: BrokerGrant, context: AuthenticationContext,
        vault: Vault
    ) throws(LockboxError) -> (inout FieldEncoder) -> Void {
        let keys = keyStore(vault)
        switch operation {
        case .generateKey:
            let fields: (name: String?, purposes: Int?, tag: Data?, label: String?, group: String?)
            do throws(FieldDecoder.Malformed) {
                fields = (try arguments.string(), try arguments.integer(), try arguments.data(), try arguments.string(), try arguments.string())
            } catch {
                throw Self.malformed
            }
            guard let name = fields.name, let algorithm = KeyAlgorithm(rawValue: name),
                let purposes = fields.purposes, let purposeBits = UInt8(exactly: purposes), let tag = fields.tag, arguments.isAtEnd
            else { throw Self.malformed }
            let label = fields.label
            let accessGroup = fields.group ?? grant.defaultAccessGroup
            guard grant.allows(accessGroup) else { throw grant.missing(accessGroup) }
            var specification = KeySpecification(algorithm: algorithm, purposes: KeyPurposes(rawValue: purposeBits))
            specification.applicationTag = tag
            specification.label = label
            specification.accessGroup = accessGroup
            specification.isExtractable = false
            let key = try keys.generate(specification)
            let der = key.publicKey?.derRepresentation ?? Data()
            return { $0.bytes(der) }
        case .sign:
            let fields: (tag: Data?, label: String?, message: Data?)
            do throws(FieldDecoder.Malformed) {
                fields = (try arguments.data(), try arguments.string(), try arguments.data())
            } catch {
                throw Self.malformed
            }
            guard let tag = fields.tag, let message = fields.message, arguments.isAtEnd else { throw Self.malformed }
            let label = fields.label
            let key = try permittedKey(tag: tag, label: label, grant: grant, vault: vault, keys: keys)
            let signature = try key.sign(message, context: context)
            return { $0.bytes(signature) }
        case .encrypt:
            // The tag and label, the plaintext and the associated data: LockboxKeys' AES-GCM box.
            let fields: (tag: Data?, label: String?, plaintext: [UInt8]?, associated: Data?)
            do throws(FieldDecoder.Malformed) {
                fields = (try arguments.data(), try arguments.string(), try arguments.bytes(), try arguments.data())
            } catch {
                throw Self.malformed
            }
            guard let tag = fields.tag, var plaintext = fields.plaintext, arguments.isAtEnd else { throw Self.malformed }
            let secret = SecretBytes(copying: plaintext)
            plaintext.wipe()
            let key = try permittedKey(tag: tag, label: fields.label, grant: grant, vault: vault, keys: keys)
            let box = try key.encrypt(secret, authenticating: fields.associated ?? Data(), context: context)
            return { $0.bytes(box) }
        case .decrypt:
            // The tag and label, the scheme ("aes-gcm": LockboxKeys' box; else an ECIES
            // algorithm's SecKeyAlgorithm name), the ciphertext and the associated data.
            let fields: (tag: Data?, label: String?, scheme: String?, box: Data?, associated: Data?)
            do throws(FieldDecoder.Malformed) {
                fields = (try arguments.data(), try arguments.string(), try arguments.string(), try arguments.data(), try arguments.data())
            } catch {
                throw Self.malformed
            }
            guard let tag = fields.tag, let scheme = fields.scheme, let box = fields.box, arguments.isAtEnd else { throw Self.malformed }
            let label = fields.label
            let associated = fields.associated ?? Data()
            let ecies = ECIES.scheme(named: scheme)
            guard scheme == "aes-gcm" || ecies != nil else {
                throw LockboxError(.param, "The decryption scheme is neither aes-gcm nor an ECIES algorithm's name.")
            }
            let key = try permittedKey(tag: tag, label: label, grant: grant, vault: vault, keys: keys)
            let plaintext: SecretBytes
            if let (hash, variableIV) = ecies {
                guard key.algorithm == .p256, associated.isEmpty else {
                    throw LockboxError(.param, "ECIES decrypts with a P-256 key and takes no associated data; this key is \(key.algorithm).")
                }
                plaintext = try ECIES.open(Array(box), hash: hash, variableIV: variableIV) { (point) throws(LockboxError) in
                    try key.sharedSecret(with: try PublicKey(x963Representation: Data(point)), context: context)
                }
            } else {
                plaintext = try key.decrypt(box, authenticating: associated, context: context)
            }
            return { encoder in plaintext.withUnsafeBytes { encoder.bytes(Array($0)) } }
        case .publicKey:
            let fields: (tag: Data?, label: String?)
            do throws(FieldDecoder.Malformed) {
                fields = (try arguments.data(), try arguments.string())
            } catch {
                throw Self.malformed
            }
            guard let tag = fields.tag, arguments.isAtEnd else { throw Self.malformed }
            let label = fields.label
            let key = try permittedKey(tag: tag, label: label, grant: grant, vault: vault, keys: keys)
            guard let publicKey = key.publicKey else { throw LockboxError(.param, "A symmetric key has no public half.") }
            let der = publicKey.derRepresentation
            return { $0.bytes(der) }
        default:
            throw LockboxError(.unimplemented, "Not a key operation.")
        }
    }

    /// The key with this tag and label in one of the peer's groups.
    private func permittedKey(tag: Data, label: String?, grant: BrokerGrant, vault: Vault, keys: SoftwareKeyStore) throws(LockboxError) -> ManagedKey {
        var query = Query(.key, limit: .one, returning: [.persistentReference])
        query.attributes.applicationTag = tag
        query.attributes.label = label
        let permitted = try BrokerService(vault: vault).matching(query, grant: grant)
        guard let reference = permitted.first?.persistentReference,
            let key = try keys.keys(applicationTag: tag, label: label).first(where: { $0.persistentReference == reference })
        else { throw LockboxError(.itemNotFound, "No key with this application tag is in the keychain.") }
        return key
    }
}
