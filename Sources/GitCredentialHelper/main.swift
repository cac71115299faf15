// git-credential-lockbox: git's credential helper protocol over the Lockbox keychain.
//   git config --global credential.helper lockbox
import CredentialHelpers
import Lockbox
import LockboxCore

/// The keychain Keychain.open() chooses: the vault by default, the desktop keyring with
/// LOCKBOX_BACKEND=secret-service.
func openStore() -> any ItemStore {
    do {
        return try Keychain.open().store
    } catch {
        HelperProcess.finish(HelperOutcome(standardError: "git-credential-lockbox: \(error)", exitStatus: 1))
    }
}

// A standard descriptor left closed is taken by no file or socket opened below.
HelperProcess.reserveStandardDescriptors()
// Before this process hides its /proc files: the broker, when one is used, identifies it now.
Keychain.prepareBroker()
guard HelperProcess.hardenProcess() else {
    HelperProcess.finish(
        HelperOutcome(
            standardError: "git-credential-lockbox: could not make this process non-dumpable (prctl PR_SET_DUMPABLE); "
                + "refusing to handle credentials", exitStatus: 1))
}
// A path read from the environment with bytes that are not UTF-8 would name another keychain.
if let variable = ProcessEnvironment.firstVariableNotUTF8() {
    HelperProcess.finish(
        HelperOutcome(
            standardError: "git-credential-lockbox: the environment variable \(variable) is not UTF-8 text (not shown); set it to UTF-8 text",
            exitStatus: 64))
}
let arguments = CommandLine.arguments
guard arguments.count == 2 else {
    HelperProcess.finish(
        HelperOutcome(standardError: "usage: git-credential-lockbox <get|store|erase>", exitStatus: 64))
}
var input = HelperProcess.readStandardInput(limit: GitCredential.maximumInputSize)
let helper = GitCredentialHelper(store: openStore())
let outcome = helper.run(operation: arguments[1], input: input)
input.wipe()
HelperProcess.finish(outcome)
