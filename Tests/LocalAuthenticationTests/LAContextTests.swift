#if !canImport(Darwin)
import Foundation
import KeychainCompatibility
import LocalAuthentication
import Lockbox
import LockboxTestSupport
import Testing

/// Answers with the fixture's passphrase, or a wrong one, counting the questions.
final class ScriptedPassphrase: PresenceVerifier, @unchecked Sendable {
    private let lock = NSLock()
    private var asked = 0
    let text: String
    init(_ text: String = VaultFixture.passphraseText) { self.text = text }
    var count: Int { lock.withLock { asked } }

    func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        lock.withLock { asked += 1 }
        return SecretBytes(utf8: text)
    }
}

/// LAContext on Linux (developer.apple.com/documentation/localauthentication/lacontext): the
/// passphrase is the device owner's authentication; there is no biometry.
@Suite("LAContext", .serialized)
struct LAContextTests {
    // LAError.Code raw values are Apple's (LAError.h: LAErrorBiometryNotAvailable = -6, ...).
    @Test func errorCodes_areApples_andBridgeToNSError() {
        #expect(LAError.Code.authenticationFailed.rawValue == -1)
        #expect(LAError.Code.userCancel.rawValue == -2)
        #expect(LAError.Code.passcodeNotSet.rawValue == -5)
        #expect(LAError.Code.biometryNotAvailable.rawValue == -6)
        #expect(LAError.Code.invalidContext.rawValue == -10)
        #expect(LAError.Code.notInteractive.rawValue == -1004)
        let error = LAError(.biometryNotAvailable, message: "none") as NSError
        #expect(error.domain == LAErrorDomain)
        #expect(error.code == -6)
        #expect(LAContext().biometryType == .none)
    }

    @Test func withoutAVerifier_theOwnerPolicyIsNotInteractive() throws {
        let fixture = try VaultFixture()
        LAContext.presenceVerifier = nil
        SecItemStore.withStore(fixture.vault) {
            var error: NSError?
            #expect(!LAContext().canEvaluatePolicy(.deviceOwnerAuthentication, error: &error))
            #expect(error?.code == LAError.Code.notInteractive.rawValue)
        }
    }

    @Test func aWrongPassphrase_failsTheEvaluation_andRemembersNothing() async throws {
        let fixture = try VaultFixture { $0.unlockCache = .processMemory }
        let wrong = ScriptedPassphrase("not the passphrase")
        LAContext.presenceVerifier = wrong
        defer { LAContext.presenceVerifier = nil }
        await SecItemStore.withStore(fixture.vault) {
            let context = LAContext()
            context.touchIDAuthenticationAllowableReuseDuration = 60
            await #expect(throws: LAError(.authenticationFailed)) {
                try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "test")
            }
            #expect(wrong.count == 1)
            // The reply form reports on another thread, with the same error.
            let outcome: (Bool, Int?) = await withCheckedContinuation { continuation in
                context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "test") { success, error in
                    continuation.resume(returning: (success, (error as? LAError)?.code.rawValue))
                }
            }
            #expect(outcome.0 == false && outcome.1 == LAError.Code.authenticationFailed.rawValue)
        }
    }

    // LocalAuthentication: LAContext.canEvaluatePolicy / evaluatePolicy
    // (developer.apple.com/documentation/localauthentication/lacontext), LAError.biometryNotAvailable
    // where the device has no biometry, and "Using an evaluated context as kSecUseAuthenticationContext"
    // with touchIDAuthenticationAllowableReuseDuration
    // (developer.apple.com/documentation/localauthentication/accessing-keychain-items-with-face-id-or-touch-id).
    @Test func laContext_evaluatedOnce_opensAccessControlledItems_withinItsReuseWindow() async throws {
        let fixture = try VaultFixture { $0.unlockCache = .processMemory }
        let verifier = ScriptedPassphrase()
        LAContext.presenceVerifier = verifier
        defer { LAContext.presenceVerifier = nil }
        try await SecItemStore.withStore(fixture.vault) {
            let context = LAContext()
            var error: NSError?
            #expect(!context.canEvaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, error: &error))
            #expect(error?.code == LAError.Code.biometryNotAvailable.rawValue)
            #expect(error?.domain == LAErrorDomain)
            #expect(context.canEvaluatePolicy(.deviceOwnerAuthentication, error: &error))
            await #expect(throws: LAError(.biometryNotAvailable)) {
                try await context.evaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, localizedReason: "unlock")
            }

            let control = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .userPresence, nil))
            let item: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "api.example.com",
                kSecAttrAccount as String: "guarded", kSecValueData as String: Data("secret".utf8), kSecAttrAccessControl as String: control,
            ]
            #expect(SecItemAdd(item as CFDictionary, nil) == errSecSuccess)

            context.touchIDAuthenticationAllowableReuseDuration = 60
            #expect(try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "read the token"))
            #expect(verifier.count == 1)
            let query: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "guarded", kSecReturnData as String: true,
                kSecUseAuthenticationContext as String: context,
            ]
            for _ in 0..<2 {
                var result: CFTypeRef?
                #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
                #expect(result as? Data == Data("secret".utf8))
            }
            #expect(verifier.count == 1, "the evaluated context is reused, not asked again")
            // kSecUseAuthenticationUIFail still uses the context's verification (it asks nothing).
            var failing = query
            failing[kSecUseAuthenticationUI as String] = kSecUseAuthenticationUIFail
            var quiet: CFTypeRef?
            #expect(SecItemCopyMatching(failing as CFDictionary, &quiet) == errSecSuccess)
            #expect(verifier.count == 1)
            let fresh: [String: Any] = [
                kSecClass as String: kSecClassGenericPassword, kSecAttrAccount as String: "guarded", kSecReturnData as String: true,
                kSecUseAuthenticationContext as String: LAContext(), kSecUseAuthenticationUI as String: kSecUseAuthenticationUIFail,
            ]
            #expect(SecItemCopyMatching(fresh as CFDictionary, &quiet) == errSecInteractionNotAllowed)
            #expect(verifier.count == 1)

            context.invalidate()
            var result: CFTypeRef?
            #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecInteractionNotAllowed)
            #expect(!context.canEvaluatePolicy(.deviceOwnerAuthentication, error: &error))
            #expect(error?.code == LAError.Code.invalidContext.rawValue)
        }
    }

    @Test func reuseDuration_isCappedAtApplesMaximum() {
        let context = LAContext()
        context.touchIDAuthenticationAllowableReuseDuration = 10_000
        #expect(context.touchIDAuthenticationAllowableReuseDuration == LATouchIDAuthenticationMaximumAllowableReuseDuration)
        context.touchIDAuthenticationAllowableReuseDuration = -1
        #expect(context.touchIDAuthenticationAllowableReuseDuration == 0)
    }
}
#endif
