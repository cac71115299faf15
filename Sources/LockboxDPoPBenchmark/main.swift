// What a DPoP proof costs beside the signature inside it: a managed P-256 key's signature of a
// proof-sized message, and a whole proof (claims, JSON, base64url, the signature) with the same
// key. Run: swift run -c release lockbox-dpop-bench [--operations N]
import Foundation
import LockboxAuth
import LockboxAuthKeys
import LockboxCore
import LockboxKeys
import LockboxVault

let operations = CommandLine.arguments.count > 2 && CommandLine.arguments[1] == "--operations" ? Int(CommandLine.arguments[2]) ?? 2000 : 2000

/// Median microseconds per call of `body` over `operations` calls.
func measure(_ body: () async throws -> Void) async rethrows -> Double {
    var samples: [Double] = []
    samples.reserveCapacity(operations)
    for _ in 0..<operations {
        let start = DispatchTime.now().uptimeNanoseconds
        try await body()
        samples.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1000)
    }
    return samples.sorted()[samples.count / 2]
}

var template = Array("/tmp/lockbox-dpop-bench-XXXXXX".utf8CString)
let directory = String(cString: mkdtemp(&template)!)
defer { try? FileManager.default.removeItem(atPath: directory) }
var configuration = Vault.Configuration()
configuration.keyDerivation = .interactive
configuration.unlockCache = .processMemory
let vault = try Vault.create(at: directory + "/bench.lockbox", passphrase: SecretBytes(utf8: "benchmark"), configuration: configuration)
defer { vault.lockAll() }
let key = try ManagedProofSigningKey.generate(in: SoftwareKeyStore(vault: vault), session: "bench")
let proofs = DPoPProofFactory(key: key)
let endpoint = URL(string: "https://issuer.example.org/oauth/token")!
let sample = try await proofs.proof(method: "POST", url: endpoint, nonce: "server-nonce-0123456789")
let signingInput = Data(sample.split(separator: ".").prefix(2).joined(separator: ".").utf8)

let signature = try await measure { _ = try key.key.sign(signingInput) }
let asyncSignature = try await measure { _ = try await key.jwsSignature(for: signingInput) }
let proof = try await measure { _ = try await proofs.proof(method: "POST", url: endpoint, nonce: "server-nonce-0123456789") }
print("operation (\(operations) runs, median)           µs")
print(String(format: "%-40@ %8.1f", "P-256 signature of a proof's input" as NSString, signature))
print(String(format: "%-40@ %8.1f", "the same, async (off the cooperative pool)" as NSString, asyncSignature))
print(String(format: "%-40@ %8.1f", "whole DPoP proof (claims, JSON, sign)" as NSString, proof))
print(String(format: "%-40@ %8.2fx", "proof / synchronous signature" as NSString, proof / signature))
print(String(format: "%-40@ %8.2fx", "proof / async signature" as NSString, proof / asyncSignature))
