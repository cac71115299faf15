#if !canImport(Darwin)
import Foundation
import Lockbox
import LockboxKeys
import Synchronization

/// The parameters of ``SecKeyCreateRandomKey(_:_:)``: top-level attributes, then
/// `kSecPrivateKeyAttrs` (which wins for the private key, as on Apple platforms).
struct KeyRequest {
    var algorithm: KeyAlgorithm
    var isPermanent = false
    var wantsHardware = false
    var specification: KeySpecification
    var context: AuthenticationContext?

    init(_ parameters: CFDictionary) throws(LockboxError) {
        guard let top = parameters.stringKeyed else { throw LockboxError(.param, "The parameter keys must be strings.") }
        var merged = top
        if let value = top[kSecPrivateKeyAttrs] {
            guard let privateAttributes = (QueryValue.unwrapped(value) as? NSDictionary)?.stringKeyed
                ?? (QueryValue.unwrapped(value) as? [String: Any])
            else {
                throw LockboxError(.param, "kSecPrivateKeyAttrs must be a dictionary.")
            }
            merged.merge(privateAttributes) { $1 }
        }
        switch top[kSecAttrKeyType].flatMap(Self.code) {
        case kSecAttrKeyTypeECSECPrimeRandom, kSecAttrKeyTypeEC: algorithm = .p256
        case kSecAttrKeyTypeEd25519: algorithm = .ed25519
        case kSecAttrKeyTypeX25519: algorithm = .x25519
        case kSecAttrKeyTypeRSA:
            throw LockboxError(.unimplemented, "RSA keys are not supported; use kSecAttrKeyTypeECSECPrimeRandom (P-256).")
        case nil: throw LockboxError(.param, "kSecAttrKeyType is required (kSecAttrKeyTypeECSECPrimeRandom).")
        case let other?: throw LockboxError(.param, "kSecAttrKeyType \(other) is not a key type Lockbox makes.")
        }
        if let size = top[kSecAttrKeySizeInBits].flatMap(QueryValue.integer), size != 256 {
            throw LockboxError(.param, "Keys of type \(algorithm) are 256 bits; kSecAttrKeySizeInBits was \(size).")
        }
        specification = KeySpecification(algorithm: algorithm, purposes: algorithm.possiblePurposes)
        if let token = top[kSecAttrTokenID].flatMap(QueryValue.string) {
            guard token == kSecAttrTokenIDSecureEnclave else {
                throw LockboxError(.param, "kSecAttrTokenID \(token) is not a token Lockbox knows; use kSecAttrTokenIDSecureEnclave.")
            }
            wantsHardware = true
        }
        isPermanent = merged[kSecAttrIsPermanent].flatMap(QueryValue.bool) ?? false
        specification.applicationTag = try merged[kSecAttrApplicationTag].map { (value) throws(LockboxError) in
            if let data = QueryValue.data(value) { return data }
            if let text = QueryValue.string(value) { return Data(text.utf8) }
            throw LockboxError(.param, "kSecAttrApplicationTag must be Data.")
        }
        specification.label = merged[kSecAttrLabel].flatMap(QueryValue.string)
        specification.accessGroup = merged[kSecAttrAccessGroup].flatMap(QueryValue.string)
        specification.isExtractable = merged[kSecAttrIsExtractable].flatMap(QueryValue.bool) ?? false
        if let code = merged[kSecAttrAccessible].flatMap(QueryValue.string) {
            guard let accessibility = AccessibilityCode.accessibility(for: code) else {
                throw LockboxError(.param, "kSecAttrAccessible must be a kSecAttrAccessible* value.")
            }
            specification.accessibility = accessibility
        }
        if let value = merged[kSecAttrAccessControl] {
            guard let control = QueryValue.unwrapped(value) as? SecAccessControl else {
                throw LockboxError(.param, "kSecAttrAccessControl must come from SecAccessControlCreateWithFlags.")
            }
            specification.accessibility = control.protection
            switch control.linuxRequirement {
            case .none: break
            case .unavailableHardware:
                throw LockboxError(.authFailed, "This access control needs biometry, which Linux does not have. Use .userPresence.")
            case .userVerification:
                specification.accessControl = control.lockboxAccessControl
            }
        }
        // Usage flags narrow the purposes, as kSecAttrCanSign: false does on Apple platforms.
        let usage: [(CFString, KeyPurposes)] = [
            (kSecAttrCanSign, .sign), (kSecAttrCanVerify, .verify), (kSecAttrCanDerive, .keyAgreement),
            (kSecAttrCanDecrypt, .keyAgreement),
        ]
        for (key, purpose) in usage where merged[key].flatMap(QueryValue.bool) == false {
            specification.purposes.remove(purpose)
        }
        if specification.purposes.isEmpty { specification.purposes = algorithm.possiblePurposes }
        if let value = merged[kSecUseAuthenticationContext] {
            context = QueryValue.unwrapped(value).flatMap(SecItemRequest.authenticationContext(of:))
        }
    }

    /// A type or class code given as a string or a number (Apple's codes are numbers in strings).
    static func code(_ value: Any) -> String? {
        if let number = QueryValue.integer(value) { return String(number) }
        return QueryValue.string(value)
    }
}

/// The key store behind `SecKey`: the managed keys of the vault ``SecItemStore`` selects.
enum SecKeyStore {
    static func current() throws(LockboxError) -> SoftwareKeyStore {
        guard let vault = try SecItemStore.current() as? Vault else {
            throw LockboxError(.unimplemented, "Keys (SecKey) are kept in the vault; this keychain's backend has none.")
        }
        return SoftwareKeyStore(vault: vault, tpmDevice: SecKeyHardware.device)
    }
}

/// Where `kSecAttrTokenID: kSecAttrTokenIDSecureEnclave` leads: the one place that maps Apple's
/// Secure Enclave to the machine's key hardware, a TPM 2.0 (``KeyToken/hardware``).
///
/// A hardware key is a P-256 signing key made inside the TPM and kept in the keychain as the
/// TPM's wrapped blob (docs/KEYS.md). On a machine without a usable TPM, asking for one fails
/// with `errSecUnimplemented` (-4), as `SecKeyCreateRandomKey` does on an Apple device without
/// a Secure Enclave, with the reason; it never falls back to a software key.
public enum SecKeyHardware {
    /// The TPM keys are made in, as a TCTI ("device:/dev/tpmrm0"); nil: `LOCKBOX_TPM_TCTI`, else
    /// `/dev/tpmrm0`.
    public static var device: String? {
        get { configuredDevice.withLock { $0 } }
        set { configuredDevice.withLock { $0 = newValue } }
    }
    private static let configuredDevice = Mutex<String?>(nil)

    /// Whether keys can be made in hardware on this machine, and why not.
    public static var availability: (isAvailable: Bool, reason: String) {
        let hardware = SoftwareKeyStore.hardwareAvailability(device: device)
        return (hardware.isAvailable, hardware.reason)
    }

    static func createRandomKey(_ request: KeyRequest) throws(LockboxError) -> SecKey {
        let (isAvailable, reason) = availability
        guard isAvailable else {
            throw LockboxError(.unimplemented, "kSecAttrTokenIDSecureEnclave: \(reason) Leave out kSecAttrTokenID for a software key.")
        }
        guard request.algorithm == .p256 else {
            throw LockboxError(.param, "kSecAttrTokenIDSecureEnclave makes P-256 keys only (kSecAttrKeyTypeECSECPrimeRandom).")
        }
        guard request.isPermanent else {
            throw LockboxError(
                .param, "A hardware key is kept in the keychain as the TPM's wrapped blob: give kSecAttrIsPermanent: true.")
        }
        var specification = request.specification
        specification.token = .hardware
        // The TPM signs; it does not agree keys or decrypt here.
        specification.purposes = specification.purposes.intersection([.sign, .verify])
        guard !specification.purposes.isEmpty else {
            throw LockboxError(.param, "A hardware key signs and verifies; kSecAttrCanSign must not be false.")
        }
        let keys = try SecKeyStore.current()
        return SecKey(.stored(try keys.generate(specification)), context: request.context)
    }
}

extension SecAccessControl {
    /// The constraints as the vault enforces them.
    var lockboxAccessControl: AccessControl {
        var result: AccessControl.Flags = []
        if flags.contains(.userPresence) { result.insert(.userPresence) }
        if flags.contains(.devicePasscode) { result.insert(.devicePasscode) }
        if flags.contains(.biometryAny) { result.insert(.biometryAny) }
        if flags.contains(.biometryCurrentSet) { result.insert(.biometryCurrentSet) }
        if flags.contains(.or) { result.insert(.or) }
        if flags.contains(.and) { result.insert(.and) }
        return AccessControl(result)
    }
}
#endif
