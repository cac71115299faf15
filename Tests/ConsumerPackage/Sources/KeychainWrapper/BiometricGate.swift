// Unconditional `import LocalAuthentication`, as several wrapper libraries have it.
import Foundation
import LocalAuthentication

public final class BiometricGate {
    public let context = LAContext()

    public init(reuse: TimeInterval) {
        context.touchIDAuthenticationAllowableReuseDuration = reuse
    }

    public var biometryAvailable: Bool {
        var error: NSError?
        let available = context.canEvaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, error: &error)
        if let error = error, error.code == LAError.biometryNotAvailable.rawValue { return false }
        return available
    }

    public func unlock(reason: String, completion: @escaping @Sendable (Bool, Error?) -> Void) {
        context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: reason, reply: completion)
    }

    public func forget() {
        context.invalidate()
    }
}
