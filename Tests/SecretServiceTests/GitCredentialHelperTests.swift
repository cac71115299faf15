import CredentialHelpers
import Foundation
import LockboxCore
import LockboxTestSupport
import SecretService
import Testing

/// The git credential protocol as a pure parser.
@Suite("git credential protocol: parsing")
struct GitCredentialParsingTests {
    @Test func parse_keyValueLines_fillsTheCredential_andIgnoresUnknownKeys() throws {
        let input = Array("protocol=https\nhost=example.com:8443\npath=a/b.git\nusername=alice\npassword=pw=with=equals\ncapability[]=authtype\nfuture_key=x\n\nhost=ignored\n".utf8)
        let credential = try GitCredential.parse(input)
        #expect(credential.protocol == "https")
        #expect(credential.host == "example.com:8443")
        #expect(credential.path == "a/b.git")
        #expect(credential.username == "alice")
        #expect(credential.password?.utf8String == "pw=with=equals")
    }

    @Test func parse_linesOver64KiB_areAccepted_andInputOver1MiB_isRefused() throws {
        // git >= 2.41 passes whole WWW-Authenticate headers as wwwauth[] lines; they can be long.
        let header = "Bearer realm=\"x\", scope=\"" + String(repeating: "s", count: 200_000) + "\""
        let long = Array("protocol=https\nhost=h.example\nwwwauth[]=\(header)\npath=\(String(repeating: "p", count: 70_000))\n\n".utf8)
        let credential = try GitCredential.parse(long)
        #expect(credential.host == "h.example")
        #expect(credential.path?.utf8.count == 70_000)

        let largest = Array("password=".utf8) + [UInt8](repeating: UInt8(ascii: "x"), count: GitCredential.maximumInputSize - 9)
        #expect(try GitCredential.parse(largest).password?.count == GitCredential.maximumInputSize - 9)
        do {
            _ = try GitCredential.parse(largest + [UInt8(ascii: "x")])
            Issue.record("input over 1 MiB was accepted")
        } catch {
            #expect(error.description.contains("1 MiB"), "\(error)")
        }
    }

    @Test(arguments: [
        "https://h.example/repo%0Aoauth_refresh_token=injected", "https://h.example/repo%0apassword_expiry_utc=1",
        "https://h.example/repo%0Dx", "https://alice%0Apassword=injected@h.example/",
        "https://alice:pw%0Aoauth_refresh_token=injected@h.example/", "https://h.example%0Apath=x/repo",
        "https://h.example/a%00b", "https://h.example/a%7Fb", "https://h.example/a%09b", "https://h.example/a%1Bb",
    ])
    func parse_urlWithPercentEncodedControlCharacter_isRefused(url: String) {
        do {
            let credential = try GitCredential.parse(Array("url=\(url)\n\n".utf8))
            Issue.record("accepted; password_expiry_utc=\(String(describing: credential.passwordExpiryUTC))")
        } catch {
            #expect(error.description.contains("control character"), "\(error)")
            #expect(!error.description.contains("injected"))
        }
    }

    @Test(arguments: [
        "password=pw\rinjected", "password=pw\u{1B}[2J", "username=alice\rx", "host=h.example\u{7F}",
        "protocol=ht\ttps", "path=a\u{0}b", "oauth_refresh_token=t\rinjected", "password_expiry_utc=1\r2",
        "wwwauth[]=Basic\rrealm=x", "future_key=a\u{1}b",
    ])
    func parse_controlCharacterInsideAValue_isRefused(line: String) {
        #expect(throws: GitCredential.ParseError.self) {
            try GitCredential.parse(Array("protocol=https\nhost=h.example\n\(line)\n\n".utf8))
        }
    }

    @Test func parse_tabInAnIgnoredHeaderLine_isAccepted_andCRLFLineEnds_stillAre() throws {
        let credential = try GitCredential.parse(Array("protocol=https\r\nhost=h.example\r\nwwwauth[]=Basic\trealm=x\r\n\r\n".utf8))
        #expect(credential.host == "h.example")
    }

    @Test func parse_lineWithoutEquals_isRefusedWithoutQuotingIt() {
        let canary = TestBus.canary()
        do {
            _ = try GitCredential.parse(Array("protocol=https\n\(canary)\n".utf8))
            Issue.record("a line without '=' was accepted")
        } catch {
            #expect(!"\(error)".contains(canary))
        }
    }

    @Test func parse_url_isSplitIntoItsParts() throws {
        let credential = try GitCredential.parse(Array("url=https://bob:s%40cret@git.example.com:8080/team/repo.git\n".utf8))
        #expect(credential.protocol == "https")
        #expect(credential.host == "git.example.com:8080")
        #expect(credential.path == "team/repo.git")
        #expect(credential.username == "bob")
        #expect(credential.password?.utf8String == "s@cret")
    }

    @Test func parse_crlfLines_andEmptyInput_areAccepted() throws {
        #expect(try GitCredential.parse(Array("host=a\r\nusername=b\r\n".utf8)).username == "b")
        #expect(try GitCredential.parse([]).host == nil)
    }
}

/// The helper over the real Secret Service, driven in-process and by real `git`.
@Suite("git credential helper against gnome-keyring")
struct GitCredentialHelperTests {
    @Test func store_thenGet_returnsPasswordExpiryAndRefreshToken() throws {
        let helper = GitCredentialHelper(store: try TestBus.store())
        let host = TestBus.unique("git") + ".example"
        let canary = TestBus.canary()
        let stored = helper.run(
            operation: "store",
            input: Array("protocol=https\nhost=\(host)\nusername=alice\npassword=\(canary)\npassword_expiry_utc=4102444800\noauth_refresh_token=refresh-\(canary)\n\n".utf8))
        #expect(stored.exitStatus == 0, "\(stored.standardError)")
        let answer = helper.run(operation: "get", input: Array("protocol=https\nhost=\(host)\n\n".utf8))
        let text = String(decoding: answer.standardOutput, as: UTF8.self)
        #expect(text == "username=alice\npassword=\(canary)\npassword_expiry_utc=4102444800\noauth_refresh_token=refresh-\(canary)\n")
    }

    @Test func get_expiredPassword_returnsNothing() throws {
        let helper = GitCredentialHelper(store: try TestBus.store())
        let host = TestBus.unique("expired") + ".example"
        _ = helper.run(
            operation: "store",
            input: Array("protocol=https\nhost=\(host)\nusername=alice\npassword=old\npassword_expiry_utc=1000\n".utf8))
        let answer = helper.run(operation: "get", input: Array("protocol=https\nhost=\(host)\n".utf8))
        #expect(answer.exitStatus == 0)
        #expect(answer.standardOutput.isEmpty)
    }

    @Test func get_otherPortOrProtocol_returnsNothing() throws {
        let helper = GitCredentialHelper(store: try TestBus.store())
        let host = TestBus.unique("port") + ".example"
        _ = helper.run(operation: "store", input: Array("protocol=https\nhost=\(host):8443\nusername=a\npassword=p\n".utf8))
        #expect(helper.run(operation: "get", input: Array("protocol=https\nhost=\(host)\n".utf8)).standardOutput.isEmpty)
        #expect(helper.run(operation: "get", input: Array("protocol=http\nhost=\(host):8443\n".utf8)).standardOutput.isEmpty)
        #expect(!helper.run(operation: "get", input: Array("protocol=https\nhost=\(host):8443\n".utf8)).standardOutput.isEmpty)
    }

    @Test func unknownOperation_isIgnored() throws {
        let helper = GitCredentialHelper(store: try TestBus.store())
        let outcome = helper.run(operation: "capability", input: Array("protocol=https\n".utf8))
        #expect(outcome.exitStatus == 0)
        #expect(outcome.standardOutput.isEmpty)
    }

    @Test func gitApproveFillReject_throughTheHelper_storeAnswerAndErase() throws {
        let git = try Git()
        let host = TestBus.unique("approve") + ".example"
        let canary = TestBus.canary()
        let approve = try git.credential("approve", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(canary)\n\n")
        #expect(approve.status == 0, "\(approve.stderr)")

        let fill = try git.credential("fill", "protocol=https\nhost=\(host)\n\n")
        #expect(fill.status == 0, "\(fill.stderr)")
        #expect(fill.stdout.contains("username=alice\n"))
        #expect(fill.stdout.contains("password=\(canary)\n"))

        // Stored as an internet password under git-credential-libsecret's attributes.
        let item = try TestBus.store().item(matching: Query(.internetPassword, attributes: .internet(server: host)))
        #expect(item.attributes.protocol == .https)
        #expect(item.attributes.account == "alice")
        let secretTool = try Paths.tool("secret-tool", package: "libsecret-tools")
        let lookup = try runProcess(secretTool, ["lookup", "protocol", "https", "server", host, "user", "alice"])
        #expect(lookup.stdout == canary)

        // reject with a password that is no longer the stored one leaves the item alone...
        let staleReject = try git.credential("reject", "protocol=https\nhost=\(host)\nusername=alice\npassword=stale\n\n")
        #expect(staleReject.status == 0)
        #expect(try git.credential("fill", "protocol=https\nhost=\(host)\n\n").stdout.contains(canary))
        // ...and with the stored password, erases it.
        let reject = try git.credential("reject", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(canary)\n\n")
        #expect(reject.status == 0)
        let afterReject = try git.credential("fill", "protocol=https\nhost=\(host)\n\n")
        #expect(afterReject.status != 0, "fill must find nothing (and may not prompt)")
        #expect(!afterReject.combined.contains(canary))
        #expect(!approve.combined.contains(canary) && !reject.combined.contains(canary))
    }

    @Test func gitsOwnLibsecretHelper_andLockbox_readEachOthersItems() throws {
        let git = try Git()
        let libsecretHelper = try Git.buildLibsecretHelper()
        let host = TestBus.unique("libsecret") + ".example"
        let canary = TestBus.canary()

        // Lockbox stores, git-credential-libsecret answers.
        #expect(try git.credential("approve", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(canary)\n\n").status == 0)
        let theirs = try runProcess(libsecretHelper, ["get"], input: Array("protocol=https\nhost=\(host)\n\n".utf8))
        #expect(theirs.stdout.contains("username=alice"))
        #expect(theirs.stdout.contains("password=\(canary)"))

        // git-credential-libsecret stores, Lockbox answers.
        let otherHost = TestBus.unique("from-libsecret") + ".example"
        let stored = try runProcess(
            libsecretHelper, ["store"],
            input: Array("protocol=https\nhost=\(otherHost):8443\nusername=bob\npassword=\(canary)\n\n".utf8))
        #expect(stored.status == 0, "\(stored.stderr)")
        let fill = try git.credential("fill", "protocol=https\nhost=\(otherHost):8443\n\n")
        #expect(fill.stdout.contains("username=bob\n"))
        #expect(fill.stdout.contains("password=\(canary)\n"))
    }

    @Test func realGit_copyAddedBySecretTool_fillAnswersTheNewest_andApproveKeepsWorking() throws {
        let git = try Git()
        let host = TestBus.unique("dup-git") + ".example"
        let first = TestBus.canary()
        let approve = try git.credential("approve", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(first)\n\n")
        #expect(approve.status == 0, "\(approve.stderr)")
        ForeignDuplicateTests.nextSecond()
        // libsecret writes a second item for the same credential beside Lockbox's (with an
        // attribute of its own, so gnome-keyring does not replace Lockbox's item instead).
        let newer = TestBus.canary()
        try ForeignDuplicateTests.secretToolStore(["protocol", "https", "server", host, "user", "alice", "source", "a script"], newer)
        var all = Query(.internetPassword, attributes: .internet(server: host), limit: .all)
        all.returning = [.attributes]
        try #require(try TestBus.store().items(matching: all).count == 2, "secret-tool did not add a second item")

        let fill = try git.credential("fill", "protocol=https\nhost=\(host)\n\n")
        #expect(fill.stdout.contains("password=\(newer)\n"), "\(fill.combined)")

        // approve changes no key attribute: it succeeds and every copy holds the new password.
        let rotated = TestBus.canary()
        let again = try git.credential("approve", "protocol=https\nhost=\(host)\nusername=alice\npassword=\(rotated)\n\n")
        #expect(again.status == 0)
        #expect(again.stderr.isEmpty, "\(again.stderr)")
        #expect(try git.credential("fill", "protocol=https\nhost=\(host)\n\n").stdout.contains("password=\(rotated)\n"))
        all.returning = [.data]
        #expect(try TestBus.store().items(matching: all).map { $0.data?.utf8String } == [rotated, rotated])
    }

    @Test func helper_urlThatInjectsFields_isRefusedOnStderr_andNothingIsStoredOrAnswered() throws {
        let helper = try Paths.product("git-credential-lockbox")
        _ = try TestBus.address()
        let host = TestBus.unique("inject") + ".example"
        let canary = TestBus.canary()
        for url in [
            "https://\(host)/repo%0Aoauth_refresh_token=injected-\(canary)",
            "https://\(host)/repo%0Apassword_expiry_utc=99%0D", "https://alice:\(canary)%0D@\(host)/repo",
        ] {
            let stored = try runProcess(
                helper, ["store"], input: Array("url=\(url)\nusername=alice\npassword=\(canary)\n\n".utf8),
                environment: helperEnvironment())
            #expect(stored.status == 1)
            #expect(stored.stderr.contains("control character"), "\(stored.stderr)")
            #expect(!stored.combined.contains(canary))
            let asked = try runProcess(helper, ["get"], input: Array("url=\(url)\n\n".utf8), environment: helperEnvironment())
            #expect(asked.status == 1)
            #expect(asked.standardOutput.isEmpty)
        }
        #expect(try !TestBus.store().contains(Query(.internetPassword, attributes: .internet(server: host))))
    }

    @Test func realGit_carriageReturnInAPassword_isNeitherStoredNorAnswered() throws {
        let git = try Git()
        let secretTool = try Paths.tool("secret-tool", package: "libsecret-tools")
        let host = TestBus.unique("cr") + ".example"
        // git itself refuses a CR unless told not to; told so, it hands it to the helper.
        let approve = try git.run(
            ["-c", "credential.protectProtocol=false", "credential", "approve"],
            input: "protocol=https\nhost=\(host)\nusername=alice\npassword=pw\rinjected\n\n")
        #expect(!approve.combined.contains("injected"))
        #expect(try !TestBus.store().contains(Query(.internetPassword, attributes: .internet(server: host))))

        // A CR that another program stored is not handed to git either.
        let stored = try runProcess(
            secretTool, ["store", "--label=with a CR", "protocol", "https", "server", host, "user", "bob"],
            input: Array("pw\rinjected".utf8))
        try #require(stored.status == 0, "secret-tool store failed: \(stored.stderr)")
        let fill = try git.run(
            ["-c", "credential.protectProtocol=false", "credential", "fill"], input: "protocol=https\nhost=\(host)\n\n")
        #expect(!fill.stdout.contains("injected"))
        #expect(fill.stderr.contains("control character"), "\(fill.stderr)")
    }

    @Test func realGit_pathOver64KiB_isStoredAndAnswered() throws {
        let git = try Git()
        let host = TestBus.unique("long") + ".example"
        let canary = TestBus.canary()
        let path = "team/" + String(repeating: "r", count: 70_000) + ".git"
        let url = "https://\(host)/\(path)"
        let approve = try git.run(
            ["-c", "credential.useHttpPath=true", "credential", "approve"],
            input: "url=\(url)\nusername=alice\npassword=\(canary)\n\n")
        #expect(approve.status == 0, "\(approve.stderr)")
        let fill = try git.run(["-c", "credential.useHttpPath=true", "credential", "fill"], input: "url=\(url)\n\n")
        #expect(fill.status == 0, "\(fill.stderr)")
        #expect(fill.stdout.contains("password=\(canary)\n"))
    }

    @Test func helper_inputOver1MiB_isRefusedWithTheLimitNamed() throws {
        let helper = try Paths.product("git-credential-lockbox")
        _ = try TestBus.address()
        let header = String(repeating: "w", count: GitCredential.maximumInputSize)
        let refused = try runProcess(
            helper, ["get"], input: Array("protocol=https\nhost=h.example\nwwwauth[]=\(header)\n\n".utf8),
            environment: helperEnvironment())
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("1 MiB"), "\(refused.stderr)")
        #expect(refused.standardOutput.isEmpty)
    }

    @Test(arguments: [false, true])
    func gitCloneWithBasicAuth_overHTTPAndHTTPS_isAnsweredFromTheStore(tls: Bool) throws {
        var git = try Git()
        let canary = TestBus.canary()
        let server = try GitHTTPServer(username: "alice", password: canary, tls: tls)
        defer { server.stop() }
        if let certificate = server.certificate { git.trustedCertificate = certificate }
        let scheme = tls ? "https" : "http"

        // The credential is in the keychain before git ever asks.
        var attributes = ItemAttributes.internet(
            server: "127.0.0.1", account: "alice", protocol: InternetProtocol(name: scheme), port: server.port)
        attributes.label = "test server"
        try TestBus.store().add(Item(.internetPassword, attributes: attributes, data: SecretBytes(utf8: canary)))

        let destination = git.directory + "/clone"
        let clone = try git.run(["clone", "\(scheme)://127.0.0.1:\(server.port)/repo.git", destination])
        #expect(clone.status == 0, "\(clone.stderr)")
        #expect(FileManager.default.fileExists(atPath: destination + "/README"))
        #expect(!clone.combined.contains(canary))

        // Without the credential the same clone fails rather than prompting.
        try TestBus.store().delete(matching: Query(.internetPassword, attributes: attributes))
        let denied = try git.run(["clone", "\(scheme)://127.0.0.1:\(server.port)/repo.git", git.directory + "/denied"])
        #expect(denied.status != 0)
        #expect(denied.stderr.contains("401") || denied.stderr.contains("Authentication failed")
            || denied.stderr.contains("could not read Username"), "\(denied.stderr)")
    }
}

/// Real git, configured to use only the built git-credential-lockbox and never to prompt.
struct Git {
    let executable: String
    let helper: String
    let directory: String
    /// A PEM certificate git should trust (the test HTTPS server's), instead of the system's.
    var trustedCertificate: String?
    /// Changes to the helpers' environment, applied last (another backend, a vault path).
    var overrides: [String: String?] = [:]

    init(sourceLocation: SourceLocation = #_sourceLocation) throws {
        _ = try TestBus.address(sourceLocation: sourceLocation)
        executable = try Paths.tool("git", package: "git", sourceLocation: sourceLocation)
        helper = try Paths.product("git-credential-lockbox", sourceLocation: sourceLocation)
        directory = NSTemporaryDirectory() + "lockbox-git-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    var environment: [String: String] {
        var changes: [String: String?] = [
            "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": nil, "SSH_ASKPASS": nil, "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
        ]
        if let trustedCertificate { changes["GIT_SSL_CAINFO"] = trustedCertificate }
        var result = helperEnvironment(changes)
        for (name, value) in overrides { result[name] = value }
        return result
    }

    func run(_ arguments: [String], input: String = "") throws -> ProcessOutput {
        try runProcess(
            executable,
            ["-c", "credential.helper=", "-c", "credential.helper=\(helper)"] + arguments,
            input: Array(input.utf8), environment: environment, directory: directory, timeout: 60)
    }

    func credential(_ operation: String, _ input: String) throws -> ProcessOutput {
        try run(["credential", operation], input: input)
    }

    /// Builds git's own contrib/credential/libsecret helper from the git package's sources.
    static func buildLibsecretHelper(sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let source = "/usr/share/doc/git/contrib/credential/libsecret/git-credential-libsecret.c"
        try #require(
            FileManager.default.fileExists(atPath: source), "\(source) is missing: apt-get install git",
            sourceLocation: sourceLocation)
        let output = NSTemporaryDirectory() + "git-credential-libsecret-\(UUID().uuidString.prefix(8))"
        let shell = try Paths.tool("sh", package: "dash", sourceLocation: sourceLocation)
        let build = try runProcess(
            shell, ["-c", "cc -o \"$1\" \"$2\" $(pkg-config --cflags --libs libsecret-1 glib-2.0)", "sh", output, source])
        try #require(
            build.status == 0, "could not build git-credential-libsecret (needs cc, libsecret-1-dev): \(build.stderr)",
            sourceLocation: sourceLocation)
        return output
    }
}

/// git's smart HTTP (git-http-backend) behind HTTP basic auth, served by Python's http.server
/// on 127.0.0.1, over TLS with a fresh self-signed certificate when asked: a real server git
/// must authenticate to.
final class GitHTTPServer {
    let port: Int
    /// The server's certificate (PEM path) when it speaks TLS.
    let certificate: String?
    private let process: Process

    private static let script = #"""
        import base64, http.server, os, ssl, subprocess, sys
        root, user, certificate, key = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
        password = sys.stdin.readline().rstrip('\n')
        expected = 'Basic ' + base64.b64encode(f'{user}:{password}'.encode()).decode()
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'
            def do_GET(self): self.serve()
            def do_POST(self): self.serve()
            def log_message(self, *args): pass
            def serve(self):
                length = int(self.headers.get('Content-Length') or 0)
                body = self.rfile.read(length) if length else b''
                if self.headers.get('Authorization') != expected:
                    self.send_response(401)
                    self.send_header('WWW-Authenticate', 'Basic realm="lockbox-test"')
                    self.send_header('Content-Length', '0')
                    self.end_headers()
                    return
                path, _, query = self.path.partition('?')
                env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL='1', PATH_INFO=path,
                           QUERY_STRING=query, REQUEST_METHOD=self.command, REMOTE_USER=user,
                           REMOTE_ADDR='127.0.0.1', CONTENT_LENGTH=str(len(body)),
                           CONTENT_TYPE=self.headers.get('Content-Type', ''),
                           GIT_PROTOCOL=self.headers.get('Git-Protocol', ''))
                if self.headers.get('Content-Encoding'):
                    env['HTTP_CONTENT_ENCODING'] = self.headers['Content-Encoding']
                out = subprocess.run(['/usr/lib/git-core/git-http-backend'], input=body, env=env,
                                     capture_output=True).stdout
                separator = b'\r\n\r\n' if b'\r\n\r\n' in out else b'\n\n'
                head, _, payload = out.partition(separator)
                status, headers = 200, []
                for line in head.splitlines():
                    name, _, value = line.decode().partition(':')
                    if name.lower() == 'status':
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header('Content-Length', str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
        server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        if certificate:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certificate, key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        print(server.server_address[1], flush=True)
        server.serve_forever()
        """#

    init(username: String, password: String, tls: Bool = false, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let python = try Paths.tool("python3", package: "python3", sourceLocation: sourceLocation)
        let git = try Paths.tool("git", package: "git", sourceLocation: sourceLocation)
        let root = NSTemporaryDirectory() + "lockbox-git-server-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: root + "/work", withIntermediateDirectories: true)
        try "hello\n".write(toFile: root + "/work/README", atomically: true, encoding: .utf8)
        let quiet = SecretServiceTests.environment([
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
        ])
        for arguments in [
            ["init", "-q", "work"], ["-C", "work", "add", "README"], ["-C", "work", "commit", "-qm", "initial"],
            ["clone", "-q", "--bare", "work", "repo.git"],
        ] {
            let result = try runProcess(git, arguments, environment: quiet, directory: root)
            try #require(result.status == 0, "git \(arguments) failed: \(result.stderr)", sourceLocation: sourceLocation)
        }
        var key = ""
        if tls {
            let openssl = try Paths.tool("openssl", package: "openssl", sourceLocation: sourceLocation)
            let made = try runProcess(
                openssl,
                ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                 "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", root + "/key.pem", "-out", root + "/cert.pem"])
            try #require(made.status == 0, "openssl could not make a certificate: \(made.stderr)", sourceLocation: sourceLocation)
            certificate = root + "/cert.pem"
            key = root + "/key.pem"
        } else {
            certificate = nil
        }
        ignoreBrokenPipes()
        process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = ["-c", Self.script, root, username, certificate ?? "", key]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        // The password goes over stdin, never argv.
        try input.fileHandleForWriting.write(contentsOf: Data((password + "\n").utf8))
        try input.fileHandleForWriting.close()
        var line = Data()
        let deadline = Date().addingTimeInterval(10)
        while !line.contains(UInt8(ascii: "\n")) && Date() < deadline {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            line.append(chunk)
        }
        let parsed = Int(String(decoding: line, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
        port = try #require(parsed, "the Python git HTTP server did not start", sourceLocation: sourceLocation)
    }

    func stop() {
        if process.isRunning {
            // SIGKILL: the test runner may pass SIGTERM down as ignored.
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { stop() }
}
