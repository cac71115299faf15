// git-credential-lockbox: git's credential helper protocol over the Lockbox keychain.
//   git config --global credential.helper lockbox
import CredentialHelpers
import LockboxCore
import SecretService

HelperProcess.hardenProcess()
let arguments = CommandLine.arguments
guard arguments.count == 2 else {
    HelperProcess.finish(
        HelperOutcome(standardError: "usage: git-credential-lockbox <get|store|erase>", exitStatus: 64))
}
var input = HelperProcess.readStandardInput()
let helper = GitCredentialHelper(store: SecretServiceStore())
let outcome = helper.run(operation: arguments[1], input: input)
input.wipe()
HelperProcess.finish(outcome)
