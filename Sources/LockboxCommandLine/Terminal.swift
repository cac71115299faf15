import Foundation
import Lockbox

/// Exit statuses, as macOS `security` uses them.
package enum ExitStatus: Int32 {
    case success = 0
    case failure = 1
    case itemNotFound = 44
    case usage = 64
}

/// Asks for the passphrase on the terminal when an access-controlled item is used.
package struct TerminalVerifier: PresenceVerifier {
    package init() {}

    package func passphrase(for request: AuthenticationRequest) throws(LockboxError) -> SecretBytes {
        let passphrase: SecretBytes
        do {
            passphrase = try SecretInput.prompt("Passphrase to \(request.reason) (empty to cancel): ", limit: SecretInput.passphraseLimit)
        } catch LockboxError.notAvailable {
            throw LockboxError(
                .interactionNotAllowed, "This item needs the passphrase re-entered, and there is no terminal to ask on.")
        }
        guard !passphrase.isEmpty else {
            throw LockboxError(.userCanceled, "Cancelled: the passphrase was not given.")
        }
        return passphrase
    }
}

/// stdout and stderr, for text that is never secret.
package struct StandardStreams {
    package init() {}

    package func print(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }

    package func error(_ text: String) {
        FileHandle.standardError.write(Data((text + "\n").utf8))
    }
}
