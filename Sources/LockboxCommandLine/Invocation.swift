import Lockbox

/// A parsed command line: global options and one verb with its options. Parsing does no I/O.
/// Its own target so that the fuzzer (Fuzz/) can link the parser without the executable.
package struct Invocation {
    package var keychain: String?
    /// `--backend NAME`: overrides LOCKBOX_BACKEND and the default.
    package var backend: Keychain.Backend? = nil
    package var command: Command
}

package enum Command {
    case help(verb: String?)
    case version
    case initialize(passphraseFromStandardInput: Bool, keyDerivation: Vault.KeyDerivationStrength)
    case unlock(passphraseFromStandardInput: Bool, timeout: UInt32?)
    case lock(all: Bool)
    case status(json: Bool)
    case verify(acceptOlder: Bool, json: Bool)
    case changePassphrase(fromStandardInput: Bool)
    case addPassword(PasswordOptions)
    case findPassword(PasswordOptions)
    case deletePassword(PasswordOptions)
    case dump(json: Bool)
    case backup(file: String, passphraseFromStandardInput: Bool, replacing: Bool = false)
    case restore(file: String, passphraseFromStandardInput: Bool)
    case removePassphrase(fromStandardInput: Bool, confirmed: Bool)
    case enroll(keeper: String, remove: Bool)
    case setPassphrase(fromStandardInput: Bool)
    /// `browser`: the authorization code flow in the system browser instead of the device flow;
    /// `dpop`: the session's tokens are bound to a key of its own (DPoP, RFC 9449).
    case login(issuer: String, clientID: String, scopes: [String], browser: Bool, dpop: Bool)
    /// `proofFor`: the request (`--method`, `--url`, `--nonce`) a DPoP session's proof is for.
    case token(issuer: String?, clientID: String?, proofFor: ProofTarget?)
    case logout(issuer: String?, clientID: String?, retry: Bool)
    case authStatus(json: Bool)
    /// `ssh-agent ...`: run by `lockbox-ssh-agent`, which parses its own options.
    case sshAgent(arguments: [String])
    case sync(arguments: [String])
    case generateKey(KeyOptions)
    case sign(KeyOptions)
    case publicKey(KeyOptions)
    case deleteKey(KeyOptions)
    /// `enroll tpm2 [--pcrs LIST]`, `unenroll tpm2`.
    case enrollTPM(pcrs: [Int], remove: Bool)
    /// `enroll tpm2 --device-key [--pcrs LIST]`: this machine's device key, sealed by the TPM.
    case sealDeviceKey(pcrs: [Int])
    /// `unlock --tpm2`.
    case unlockTPM(timeout: UInt32?)
    /// `broker install-units [--lockboxd PATH]`, `broker uninstall-units`.
    case brokerUnits(install: Bool, lockboxd: String?)
    /// `broker status`, `broker stop`: the running `lockboxd` at the socket.
    case brokerControl(stop: Bool)

    /// Commands that use managed keys or the TPM: they run in `lockbox-keys`, so that only
    /// they load libcrypto and the tss2 libraries.
    package var usesKeys: Bool {
        switch self {
        case .generateKey, .sign, .publicKey, .deleteKey, .enrollTPM, .sealDeviceKey, .unlockTPM: true
        default: false
        }
    }

    /// Commands that talk to an authorization server (run asynchronously).
    package var isAuthentication: Bool {
        switch self {
        case .login, .token, .logout, .authStatus: true
        default: false
        }
    }
}

/// `lockbox token --url URL [--method METHOD] [--nonce NONCE]`: the one request a DPoP proof is
/// printed for.
package struct ProofTarget: Equatable, Sendable {
    package var method: String
    package var url: String
    /// The server's `DPoP-Nonce`, when it asked for one.
    package var nonce: String?
}

package struct PasswordOptions {
    package var itemClass: ItemClass
    package var attributes = ItemAttributes()
    /// `-w`: print only the secret (find).
    package var printSecretOnly = false
    /// `-U`: update the item when it exists (add).
    package var updateIfExists = false
    /// `--access-control` (add).
    package var accessControl: AccessControl?
    package var json = false
    /// `--raw`: the secret's bytes exactly: add stores all of standard input (no newline is
    /// removed); find -w prints the bytes with no newline after them.
    package var raw = false
    /// `--allow-empty` (add): store an empty secret instead of refusing it.
    package var allowEmpty = false
    /// `--all` (delete): delete every item of the class when no attribute is named.
    package var all = false
    /// `--synchronizable`: add a synchronizable item (`lockbox sync` carries it to the group's
    /// other devices); find and delete only synchronizable items. Without it, add makes an item
    /// that stays here, and find and delete match both kinds.
    package var synchronizable = false
}

/// The options of the key verbs (`generate-key`, `sign`, `public-key`, `delete-key`).
package struct KeyOptions {
    /// `--tag`: the application tag that names the key (required).
    package var tag = ""
    package var label: String?
    /// `--algorithm` (generate-key): p256, ed25519, x25519, aes256GCM. Kept as text: the key
    /// library checks it, and this target does not link it.
    package var algorithm = "p256"
    /// `--purpose` (generate-key), repeatable or comma-separated: sign, verify, encrypt,
    /// decrypt, key-agreement. Empty: every purpose the algorithm can have.
    package var purposes: [String] = []
    /// `--hardware` (generate-key): inside the TPM, or fail.
    package var hardware = false
    /// `--accessibility` (generate-key).
    package var accessibility: Accessibility?
    /// `--synchronizable` (generate-key): the key syncs to the keychain's sync group.
    package var synchronizable = false
    /// `--format` (public-key): pem (default), der, x963, openssh.
    package var format = "pem"
    /// `--raw` (sign): write the signature's bytes instead of a base64 line.
    package var raw = false
    package var json = false
    /// `--all` (delete-key): delete every key the tag (and label) name; without it, a delete
    /// that names more than one key is refused.
    package var all = false
}

/// A usage error: exit status 64 with the verb's help.
package struct UsageError: Error {
    package var message: String
    package var verb: String?
}

package enum Parser {
    package static let passwordVerbs: [String: ItemClass] = [
        "add-generic-password": .genericPassword, "find-generic-password": .genericPassword,
        "delete-generic-password": .genericPassword, "add-internet-password": .internetPassword,
        "find-internet-password": .internetPassword, "delete-internet-password": .internetPassword,
    ]

    package static func parse(_ arguments: [String]) throws(UsageError) -> Invocation {
        var remaining = arguments[...]
        var keychain: String?
        var backend: Keychain.Backend?
        var given: Set<String> = []
        // Global options come before the verb.
        while let first = remaining.first, first.hasPrefix("-") {
            remaining = remaining.dropFirst()
            // `--keychain A --keychain B` would use B.
            let name = first == "-k" ? "--keychain" : first
            guard given.insert(name).inserted else { throw UsageError(message: "\(name) is given more than once", verb: nil) }
            switch first {
            case "--keychain", "-k":
                guard let path = remaining.popFirst() else { throw UsageError(message: "--keychain needs a path", verb: nil) }
                keychain = path
            case "--backend":
                guard let name = remaining.popFirst(), let chosen = Keychain.Backend(rawValue: name) else {
                    throw UsageError(
                        message: "--backend takes one of: " + Keychain.Backend.allCases.map(\.rawValue).joined(separator: ", "),
                        verb: nil)
                }
                backend = chosen
            case "--help", "-h":
                return Invocation(keychain: keychain, command: .help(verb: nil))
            case "--version":
                return Invocation(keychain: keychain, command: .version)
            default:
                throw UsageError.unexpected(at: arguments.count - remaining.count, verb: nil)
            }
        }
        guard let verb = remaining.popFirst() else {
            throw UsageError(message: "no command given", verb: nil)
        }
        let verbPosition = arguments.count - remaining.count
        let options = Array(remaining)
        if options.contains("--help") || options.contains("-h") {
            return Invocation(keychain: keychain, command: .help(verb: verb))
        }
        let command = try parseVerb(verb, options, position: verbPosition)
        return Invocation(keychain: keychain, backend: backend, command: command)
    }

    private static func parseVerb(_ verb: String, _ options: [String], position: Int) throws(UsageError) -> Command {
        var reader = OptionReader(verb: verb, options: options, firstPosition: position + 1)
        switch verb {
        case "help":
            return .help(verb: reader.options.first)
        case "init":
            var fromStandardInput = false
            var strength = Vault.KeyDerivationStrength.moderate
            while let option = try reader.next() {
                switch option {
                case "--passphrase-stdin": fromStandardInput = true
                case "--kdf":
                    let name = try reader.value(for: option)
                    guard let parsed = Vault.KeyDerivationStrength(rawValue: name) else {
                        throw UsageError(message: "--kdf must be interactive, moderate or sensitive", verb: verb)
                    }
                    strength = parsed
                default: throw reader.unknown(option)
                }
            }
            return .initialize(passphraseFromStandardInput: fromStandardInput, keyDerivation: strength)
        case "unlock":
            var fromStandardInput = false
            var timeout: UInt32?
            var tpm = false
            while let option = try reader.next() {
                switch option {
                case "--tpm2": tpm = true
                case "--passphrase-stdin": fromStandardInput = true
                case "--timeout":
                    let text = try reader.value(for: option)
                    guard let seconds = UInt32(text) else {
                        throw UsageError(message: "--timeout takes whole seconds (0 for none)", verb: verb)
                    }
                    timeout = seconds
                default: throw reader.unknown(option)
                }
            }
            if tpm {
                guard !fromStandardInput else { throw UsageError(message: "--tpm2 unlocks with no passphrase", verb: verb) }
                return .unlockTPM(timeout: timeout)
            }
            return .unlock(passphraseFromStandardInput: fromStandardInput, timeout: timeout)
        case "lock":
            var all = false
            while let option = try reader.next() {
                guard option == "--all" else { throw reader.unknown(option) }
                all = true
            }
            return .lock(all: all)
        case "verify":
            var acceptOlder = false
            var json = false
            while let option = try reader.next() {
                switch option {
                case "--accept-older": acceptOlder = true
                case "--json": json = true
                default: throw reader.unknown(option)
                }
            }
            return .verify(acceptOlder: acceptOlder, json: json)
        case "status":
            var json = false
            while let option = try reader.next() {
                guard option == "--json" else { throw reader.unknown(option) }
                json = true
            }
            return .status(json: json)
        case "change-passphrase":
            var fromStandardInput = false
            while let option = try reader.next() {
                guard option == "--passphrase-stdin" else { throw reader.unknown(option) }
                fromStandardInput = true
            }
            return .changePassphrase(fromStandardInput: fromStandardInput)
        case "backup", "restore":
            var file: String?
            var fromStandardInput = false
            var replacing = false
            while let option = try reader.next() {
                switch option {
                case "--passphrase-stdin": fromStandardInput = true
                case "--replace" where verb == "backup": replacing = true
                default:
                    guard !option.hasPrefix("-"), file == nil else { throw reader.unknown(option) }
                    file = option
                }
            }
            guard let file else { throw UsageError(message: "\(verb) needs a FILE", verb: verb) }
            return verb == "backup"
                ? .backup(file: file, passphraseFromStandardInput: fromStandardInput, replacing: replacing)
                : .restore(file: file, passphraseFromStandardInput: fromStandardInput)
        case "enroll", "unenroll":
            let keeper = try reader.next()
            if keeper == "tpm2" {
                var pcrs: [Int] = []
                var deviceKey = false
                while let option = try reader.next() {
                    if option == "--device-key", verb == "enroll" {
                        deviceKey = true
                        continue
                    }
                    guard option == "--pcrs", verb == "enroll" else { throw reader.unknown(option) }
                    let list = try reader.value(for: option)
                    for part in list.split(separator: ",") {
                        guard let pcr = Int(part), (0..<24).contains(pcr) else {
                            throw UsageError(message: "--pcrs takes PCR numbers from 0 to 23, comma-separated (0,7)", verb: verb)
                        }
                        pcrs.append(pcr)
                    }
                }
                return deviceKey ? .sealDeviceKey(pcrs: pcrs) : .enrollTPM(pcrs: pcrs, remove: verb == "unenroll")
            }
            guard let keeper, keeper == "secret-service", try reader.next() == nil else {
                throw UsageError(message: "usage: lockbox \(verb) secret-service|tpm2", verb: verb)
            }
            return .enroll(keeper: keeper, remove: verb == "unenroll")
        case "generate-key", "sign", "public-key", "delete-key":
            var key = KeyOptions()
            while let option = try reader.next() {
                switch option {
                case "--tag": key.tag = try reader.value(for: option)
                case "--label": key.label = try reader.value(for: option)
                case "--algorithm" where verb == "generate-key": key.algorithm = try reader.value(for: option)
                case "--purpose" where verb == "generate-key":
                    // Every piece named: an empty value (an unset variable) is a mistake, not "every purpose".
                    let pieces = try reader.value(for: option).split(separator: ",", omittingEmptySubsequences: false)
                    guard pieces.allSatisfy({ $0.contains { $0 != " " } }) else {
                        throw UsageError(
                            message: "--purpose has an empty name: give sign, verify, encrypt, decrypt or key-agreement (comma-separated)",
                            verb: verb)
                    }
                    key.purposes += pieces.map { String($0.filter { $0 != " " }) }
                case "--hardware" where verb == "generate-key": key.hardware = true
                case "--synchronizable" where verb == "generate-key": key.synchronizable = true
                case "--accessibility" where verb == "generate-key":
                    let name = try reader.value(for: option)
                    guard let accessibility = Accessibility(rawValue: name) else {
                        throw UsageError(message: "--accessibility takes an accessibility class name (whenUnlocked, ...)", verb: verb)
                    }
                    key.accessibility = accessibility
                case "--format" where verb == "public-key":
                    let format = try reader.value(for: option)
                    guard ["pem", "der", "x963", "openssh"].contains(format) else {
                        throw UsageError(message: "--format takes pem, der, x963 or openssh", verb: verb)
                    }
                    key.format = format
                case "--raw" where verb == "sign": key.raw = true
                case "--json" where verb == "generate-key": key.json = true
                case "--all" where verb == "delete-key": key.all = true
                default: throw reader.unknown(option)
                }
            }
            guard !key.tag.isEmpty else { throw UsageError(message: "\(verb) needs --tag TAG", verb: verb) }
            switch verb {
            case "generate-key": return .generateKey(key)
            case "sign": return .sign(key)
            case "public-key": return .publicKey(key)
            default: return .deleteKey(key)
            }
        case "remove-passphrase", "set-passphrase":
            var fromStandardInput = false
            var confirmed = false
            while let option = try reader.next() {
                switch option {
                case "--passphrase-stdin": fromStandardInput = true
                case "--yes" where verb == "remove-passphrase": confirmed = true
                default: throw reader.unknown(option)
                }
            }
            return verb == "set-passphrase"
                ? .setPassphrase(fromStandardInput: fromStandardInput)
                : .removePassphrase(fromStandardInput: fromStandardInput, confirmed: confirmed)
        case "login":
            var issuer: String?
            var clientID: String?
            var scopes: [String] = []
            var browser = false
            var dpop = false
            while let option = try reader.next() {
                switch option {
                case "--issuer": issuer = try reader.value(for: option)
                case "--client-id": clientID = try reader.value(for: option)
                case "--scope": scopes += try reader.value(for: option).split(separator: " ").map(String.init)
                case "--browser": browser = true
                case "--dpop": dpop = true
                default: throw reader.unknown(option)
                }
            }
            guard let issuer, let clientID else {
                throw UsageError(message: "login needs --issuer URL and --client-id ID", verb: verb)
            }
            return .login(issuer: issuer, clientID: clientID, scopes: scopes, browser: browser, dpop: dpop)
        case "token", "logout":
            var issuer: String?
            var clientID: String?
            var retry = false
            var method: String?
            var url: String?
            var nonce: String?
            while let option = try reader.next() {
                switch option {
                case "--issuer": issuer = try reader.value(for: option)
                case "--client-id": clientID = try reader.value(for: option)
                case "--retry" where verb == "logout": retry = true
                case "--method" where verb == "token":
                    // A method is a token (RFC 9110): an empty one (an unset variable) or one
                    // with spaces or line breaks would make a proof no server accepts.
                    let given = try reader.value(for: option)
                    let tokenCharacters = Set("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
                    guard !given.isEmpty, given.allSatisfy({ tokenCharacters.contains($0) }) else {
                        throw UsageError(message: "--method takes an HTTP method such as GET or POST", verb: verb)
                    }
                    method = given
                case "--url" where verb == "token": url = try reader.value(for: option)
                case "--nonce" where verb == "token": nonce = try reader.value(for: option)
                default: throw reader.unknown(option)
                }
            }
            guard verb == "token" else { return .logout(issuer: issuer, clientID: clientID, retry: retry) }
            guard let url else {
                if method != nil || nonce != nil {
                    throw UsageError(message: "--method and --nonce describe the request a DPoP proof is for: give its --url too", verb: verb)
                }
                return .token(issuer: issuer, clientID: clientID, proofFor: nil)
            }
            return .token(issuer: issuer, clientID: clientID, proofFor: ProofTarget(method: method ?? "GET", url: url, nonce: nonce))
        case "auth":
            guard try reader.next() == "status" else { throw UsageError(message: "usage: lockbox auth status [--json]", verb: verb) }
            var json = false
            while let option = try reader.next() {
                guard option == "--json" else { throw reader.unknown(option) }
                json = true
            }
            return .authStatus(json: json)
        case "ssh-agent":
            return .sshAgent(arguments: reader.options)
        case "sync":
            return .sync(arguments: reader.options)
        case "broker":
            let usage = "usage: lockbox broker status | stop | install-units [--lockboxd PATH] | uninstall-units"
            let action = try reader.next()
            if action == "status" || action == "stop" {
                if let option = try reader.next() { throw reader.unknown(option) }
                return .brokerControl(stop: action == "stop")
            }
            guard action == "install-units" || action == "uninstall-units" else { throw UsageError(message: usage, verb: verb) }
            var lockboxd: String?
            while let option = try reader.next() {
                guard option == "--lockboxd", action == "install-units" else { throw reader.unknown(option) }
                lockboxd = try reader.value(for: option)
            }
            return .brokerUnits(install: action == "install-units", lockboxd: lockboxd)
        case "dump", "dump-keychain":
            var json = false
            while let option = try reader.next() {
                guard option == "--json" else { throw reader.unknown(option) }
                json = true
            }
            return .dump(json: json)
        default:
            guard let itemClass = passwordVerbs[verb] else {
                // Not echoed: a mistyped command line may have put a secret here.
                throw UsageError(message: "argument \(position) is not a command (not shown, in case it is a secret)", verb: nil)
            }
            let parsed = try parsePassword(verb, itemClass: itemClass, reader: &reader)
            if verb.hasPrefix("add") { return .addPassword(parsed) }
            if verb.hasPrefix("find") { return .findPassword(parsed) }
            // SecItemDelete's empty query deletes every item of the class: on the command line
            // a forgotten -s or -a must not do that, so it takes --all to say so.
            if parsed.attributes.isEmpty && !parsed.all {
                throw UsageError(
                    message: "\(verb) names no item: give -s, -a or another attribute, "
                        + "or --all to delete every \(itemClass == .internetPassword ? "internet" : "generic") password",
                    verb: verb)
            }
            return .deletePassword(parsed)
        }
    }

    private static func parsePassword(_ verb: String, itemClass: ItemClass, reader: inout OptionReader) throws(UsageError) -> PasswordOptions {
        var parsed = PasswordOptions(itemClass: itemClass)
        let isAdd = verb.hasPrefix("add")
        let isFind = verb.hasPrefix("find")
        let isDelete = verb.hasPrefix("delete")
        let isInternet = itemClass == .internetPassword
        while let option = try reader.next() {
            switch option {
            case "-a": parsed.attributes.account = try reader.value(for: option)
            case "-s":
                let value = try reader.value(for: option)
                if isInternet { parsed.attributes.server = value } else { parsed.attributes.service = value }
            case "-l": parsed.attributes.label = try reader.value(for: option)
            case "-j": parsed.attributes.comment = try reader.value(for: option)
            case "-D": parsed.attributes.itemDescription = try reader.value(for: option)
            case "-r" where isInternet: parsed.attributes.protocol = InternetProtocol(name: try reader.value(for: option))
            case "-P" where isInternet:
                let text = try reader.value(for: option)
                guard let port = Int(text), (0...65535).contains(port) else {
                    throw UsageError(message: "-P takes a port number", verb: verb)
                }
                parsed.attributes.port = port
            case "-p" where isInternet: parsed.attributes.path = try reader.value(for: option)
            case "-d" where isInternet: parsed.attributes.securityDomain = try reader.value(for: option)
            case "-t" where isInternet:
                parsed.attributes.authenticationType = AuthenticationType(rawValue: try reader.value(for: option))
            case "--access-group": parsed.attributes.accessGroup = try reader.value(for: option)
            case "--accessibility":
                let name = try reader.value(for: option)
                guard let accessibility = Accessibility(name: name) else {
                    throw UsageError(
                        message: "--accessibility takes one of: "
                            + Accessibility.allCases.map(\.rawValue).joined(separator: ", "),
                        verb: verb)
                }
                parsed.attributes.accessibility = accessibility
            case "-U" where isAdd: parsed.updateIfExists = true
            case "--access-control" where isAdd:
                let text = try reader.value(for: option)
                guard let control = AccessControl(parsing: String(text.map { $0 == "," ? "|" : $0 })) else {
                    throw UsageError(
                        message: "--access-control takes userPresence, devicePasscode, or several joined with | "
                            + "(biometryAny, biometryCurrentSet, or, and)",
                        verb: verb)
                }
                parsed.accessControl = control
            case "--raw" where isAdd || isFind: parsed.raw = true
            case "--allow-empty" where isAdd: parsed.allowEmpty = true
            case "--all" where isDelete: parsed.all = true
            case "--synchronizable":
                parsed.synchronizable = true
                if isAdd { parsed.attributes.synchronizable = true }
            case "-w":
                if isAdd {
                    // `security add-generic-password -w SECRET` puts the secret in argv, where
                    // every user can read it in /proc. Lockbox refuses that form, also when the
                    // secret starts with "-": whatever follows -w and is not an option is one.
                    if let next = reader.peek(), !passwordOptions.contains(next) {
                        throw UsageError(
                            message: "secrets are never taken from the command line (other users can read it); "
                                + "pipe the secret on standard input, or omit it to be asked on the terminal",
                            verb: verb)
                    }
                } else {
                    parsed.printSecretOnly = true
                }
            case "--json" where isFind: parsed.json = true
            default: throw reader.unknown(option)
            }
        }
        return parsed
    }

    /// Every option a password verb knows (some only for add, find or delete).
    static let passwordOptions: Set<String> = [
        "-a", "-s", "-l", "-j", "-D", "-r", "-P", "-p", "-d", "-t", "--access-group", "--accessibility", "-U",
        "--access-control", "--raw", "--allow-empty", "--all", "-w", "--json", "--help", "-h", "--synchronizable",
    ]
}

/// Walks a verb's options.
struct OptionReader {
    let verb: String
    let options: [String]
    /// The position of `options[0]` among all the arguments (counting from 1).
    let firstPosition: Int
    private var index = 0

    init(verb: String, options: [String], firstPosition: Int) {
        self.verb = verb
        self.options = options
        self.firstPosition = firstPosition
    }

    /// Options already read: an option given twice is refused (the last one would win, and
    /// `delete-generic-password -s staging -a deploy -s prod` would delete prod).
    private var seen: Set<String> = []

    /// The next option (or a verb's positional argument).
    mutating func next() throws(UsageError) -> String? {
        guard let argument = nextArgument() else { return nil }
        if argument.hasPrefix("-") {
            guard seen.insert(argument).inserted else {
                throw UsageError(message: "\(argument) is given more than once", verb: verb)
            }
        }
        return argument
    }

    private mutating func nextArgument() -> String? {
        guard index < options.count else { return nil }
        defer { index += 1 }
        return options[index]
    }

    func peek() -> String? {
        index < options.count ? options[index] : nil
    }

    mutating func value(for option: String) throws(UsageError) -> String {
        guard let value = nextArgument() else { throw UsageError(message: "\(option) needs a value", verb: verb) }
        return value
    }

    /// The error for the argument `next()` returned last. It names the argument's position,
    /// never its text: a secret typed where an option was expected must not be echoed.
    func unknown(_ option: String) -> UsageError {
        UsageError.unexpected(at: firstPosition + index - 1, verb: verb)
    }
}

extension UsageError {
    /// An argument that is not an option here, named by its position (counting from 1) only.
    static func unexpected(at position: Int, verb: String?) -> UsageError {
        UsageError(
            message: "argument \(position) is not an option\(verb.map { " of \($0)" } ?? "") "
                + "(not shown, in case it is a secret)",
            verb: verb)
    }
}

extension Invocation {
    /// Connects to the broker now when this command line uses it (``Keychain/prepareBroker(_:)``):
    /// `lockboxd` identifies a client by its `/proc` files, which the programs hide as soon as
    /// they harden themselves. Call it before hardening; parsing reads no secret.
    public static func prepareBroker(_ arguments: [String]) {
        guard let early = try? Parser.parse(arguments) else { return }
        early.prepareBroker()
    }

    /// The same, for a command line already parsed.
    public func prepareBroker() {
        Keychain.prepareBroker(Keychain.Options(backend: backend, path: keychain))
    }
}
