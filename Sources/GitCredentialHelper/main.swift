// git-credential-lockbox: git's credential helper protocol over the Lockbox keychain.
//   git config --global credential.helper lockbox
import CredentialHelpers
import Foundation
import Lockbox
import LockboxCore
import SecretService

/// The keychain: LOCKBOX_BACKEND=secret-service selects the desktop keyring; anything else
/// is Keychain.open()'s choice (the vault by default).
func openStore() -> any ItemStore {
    if ProcessInfo.processInfo.environment["LOCKBOX_BACKEND"] == "secret-service" {
        return SecretServiceStore()
    }
    do {
        return try Keychain.open().store
    } catch {
        HelperProcess.finish(HelperOutcome(standardError: "git-credential-lockbox: \(error)", exitStatus: 1))
    }
}

HelperProcess.hardenProcess()
let arguments = CommandLine.arguments
guard arguments.count == 2 else {
    HelperProcess.finish(
        HelperOutcome(standardError: "usage: git-credential-lockbox <get|store|erase>", exitStatus: 64))
}
var input = HelperProcess.readStandardInput()
let helper = GitCredentialHelper(store: openStore())
let outcome = helper.run(operation: arguments[1], input: input)
input.wipe()
HelperProcess.finish(outcome)
