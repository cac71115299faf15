// Managed-key signatures against their in-process references (targets: a software P-256
// signature within 1.5x of OpenSSL's EVP_DigestSign, an Ed25519 one within 1.5x of libsodium's
// crypto_sign_detached, a TPM one within 1.2x of ESAPI's Esys_Sign, what tpm2_sign calls, on
// the same TPM). Run: swift run -c release lockbox-key-bench [--operations N]; the TPM rows
// need LOCKBOX_TPM_TCTI (scripts/swtpm start prints it) or /dev/tpmrm0.
import Foundation
import KeyCrypto
import LockboxCore
import LockboxKeys
import LockboxVault
import TPMAccess
import VaultCrypto

let operations = CommandLine.arguments.count > 2 && CommandLine.arguments[1] == "--operations" ? Int(CommandLine.arguments[2]) ?? 2000 : 2000
let message = Array("a 64-byte message to sign, as a challenge or a JWT header would be".utf8.prefix(64))

/// Median microseconds per call of `body` over `operations` calls.
func measure(_ body: () throws -> Void) rethrows -> Double {
    var samples: [Double] = []
    samples.reserveCapacity(operations)
    for _ in 0..<operations {
        let start = DispatchTime.now().uptimeNanoseconds
        try body()
        samples.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
    }
    return samples.sorted()[samples.count / 2]
}

/// Median microseconds per call of `reference` and of `subject`, called in turn `count` times,
/// so that a busy moment of the shared machine weighs on both alike.
func measureInTurn(_ count: Int, _ reference: () throws -> Void, _ subject: () throws -> Void) rethrows -> (Double, Double) {
    var referenceSamples: [Double] = []
    var subjectSamples: [Double] = []
    for _ in 0..<count {
        var start = DispatchTime.now().uptimeNanoseconds
        try reference()
        referenceSamples.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
        start = DispatchTime.now().uptimeNanoseconds
        try subject()
        subjectSamples.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
    }
    return (referenceSamples.sorted()[count / 2], subjectSamples.sorted()[count / 2])
}

var template = Array("/tmp/lockbox-key-bench-XXXXXX".utf8CString)
let directory = String(cString: mkdtemp(&template)!)
defer { try? FileManager.default.removeItem(atPath: directory) }
var configuration = Vault.Configuration()
configuration.keyDerivation = .interactive
configuration.unlockCache = .processMemory
let vault = try Vault.create(at: directory + "/bench.lockbox", passphrase: SecretBytes(utf8: "benchmark"), configuration: configuration)
defer { vault.lockAll() }
let keys = SoftwareKeyStore(vault: vault)
let messageData = Data(message)

let p256 = try keys.generate(KeySpecification(algorithm: .p256, purposes: [.sign]))
let (p256Secret, _) = try P256.generate()
let held = try P256.SigningKey(privateRepresentation: p256Secret)
let p256Import = try measure { _ = try P256.sign(message, privateRepresentation: p256Secret) }
let (p256Reference, p256Managed) = try measureInTurn(operations, { _ = try held.sign(message) }, { _ = try p256.sign(messageData) })

let ed25519 = try keys.generate(KeySpecification(algorithm: .ed25519, purposes: [.sign]))
let (edSecret, _) = Curve25519.generateSigningKey()
let (edReference, edManaged) = try measureInTurn(operations, { _ = Curve25519.sign(message, secretKey: edSecret) }, { _ = try ed25519.sign(messageData) })

// The TPM: the same signature through ManagedKey.sign and through Esys_Sign alone.
var tpmRows: [(String, Double, Double)] = []
let tpmOperations = min(operations, 300)
if SoftwareKeyStore.hardwareAvailability().isAvailable {
    var specification = KeySpecification(algorithm: .p256, purposes: [.sign])
    specification.token = .hardware
    let hardware = try keys.generate(specification)
    var query = Query(.key, returning: [.data])
    query.persistentReference = hardware.persistentReference
    let stored = try vault.keyMaterial(matching: query).first!.data!.withUnsafeBytes { Array($0) }
    // The envelope's header precedes the TPM's blob: the blob is what the TPM loads.
    let header = 12 + 5 + 65
    let reference = try TPM.at().referenceSigner(blob: Array(stored[header...]))
    let (tpmReference, tpmManaged) = try measureInTurn(tpmOperations, reference, { _ = try hardware.sign(messageData) })
    tpmRows = [
        ("TPM P-256: Esys_Sign on a loaded key, as tpm2_sign calls it (reference)", tpmReference, tpmReference),
        ("TPM P-256: ManagedKey.sign (stamp check + SHA-256 + Esys_Sign + DER)", tpmManaged, tpmReference),
    ]
} else {
    print("no TPM (\(SoftwareKeyStore.hardwareAvailability().reason)): the TPM rows are left out")
}

func row(_ name: String, _ value: Double, _ reference: Double) -> String {
    String(format: "| %@ | %.1f | %.2fx |", name, value, value / reference)
}
print("median of \(operations) signatures of a 64-byte message, microseconds")
print("| operation | µs | vs reference |")
print("|---|---:|---:|")
print(row("P-256: EVP_DigestSign, key held in OpenSSL (reference)", p256Reference, p256Reference))
print(row("P-256: KeyCrypto, key imported per signature", p256Import, p256Reference))
print(row("P-256: ManagedKey.sign (key kept opened: stamp check + sign)", p256Managed, p256Reference))
print(row("Ed25519: crypto_sign_detached (reference)", edReference, edReference))
print(row("Ed25519: ManagedKey.sign (key kept opened: stamp check + sign)", edManaged, edReference))
for (name, value, reference) in tpmRows { print(row(name, value, reference)) }
