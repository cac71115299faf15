import Foundation
import Lockbox
import LockboxCore
import LockboxTestSupport
@testable import SecretService
import Testing

/// libsecret is opened with dlopen the first time the Secret Service backend is used: no
/// binary links it, a vault-only process never maps it, and a missing library is a clear
/// `notAvailable`.
@Suite("libsecret is loaded on first use")
struct LibraryLoadingTests {
    static let missingLibrary = "libsecret-lockbox-test-missing.so.0"

    @Test(arguments: ["lockbox", "git-credential-lockbox", "docker-credential-lockbox"])
    func builtExecutable_linksNeitherLibsecretNorGLib(_ product: String) throws {
        let binary = try Paths.product(product)
        let ldd = try runProcess(try Paths.tool("ldd", package: "libc-bin"), [binary])
        try #require(ldd.status == 0, "ldd \(binary) failed: \(ldd.combined)")
        #expect(ldd.stdout.contains("libc.so.6"), "ldd listed nothing useful: \(ldd.stdout)")
        let linked = ldd.stdout.split(separator: "\n")
            .map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { line in Self.desktopLibraries.contains(where: line.hasPrefix) }
        #expect(linked.isEmpty, "\(product) links \(linked)")
    }

    @Test func vaultCommands_neverLoadLibsecret_theSecretServiceBackendDoes() throws {
        let binary = try Paths.product("lockbox")
        let home = TemporaryDirectory("lockbox-on-demand")
        let keychain = home.file("keychains/on-demand.lockbox")
        // LD_DEBUG=files makes the dynamic loader report every library it loads, at start
        // and through dlopen, on stderr.
        let loaderTrace = environment([
            "HOME": home.path, "XDG_DATA_HOME": home.file("data"), "LOCKBOX_BACKEND": nil, "LD_DEBUG": "files",
        ])
        let canary = TestBus.canary()
        let steps: [(arguments: [String], input: String)] = [
            (["init", "--passphrase-stdin", "--kdf", "interactive"], "on-demand passphrase\n"),
            (["add-generic-password", "-s", "on-demand", "-a", "alice"], canary + "\n"),
            (["find-generic-password", "-s", "on-demand", "-a", "alice", "-w"], ""),
            (["lock", "--all"], ""),
        ]
        for step in steps {
            let output = try runProcess(
                binary, ["--keychain", keychain] + step.arguments, input: Array(step.input.utf8),
                environment: loaderTrace)
            #expect(output.status == 0, "lockbox \(step.arguments.joined(separator: " ")): \(output.stderr)")
            // The trace sees the libraries the vault does load; it would see libsecret too.
            #expect(output.stderr.contains("file=libc.so"), "no loader trace: \(output.stderr.prefix(500))")
            let loaded = Self.loadedLibraries(output.stderr).filter { Self.desktopLibraries.contains(where: $0.hasPrefix) }
            #expect(loaded.isEmpty, "lockbox \(step.arguments[0]) loaded \(loaded)")
        }

        // Choosing the Secret Service opens libsecret, even before it finds there is no bus.
        let secretService = try runProcess(
            binary, ["find-generic-password", "-s", "on-demand", "-w"],
            environment: environment([
                "HOME": home.path, "LOCKBOX_BACKEND": "secret-service", "LD_DEBUG": "files",
                "DBUS_SESSION_BUS_ADDRESS": nil, "XDG_RUNTIME_DIR": "/nonexistent",
            ]))
        #expect(secretService.status == 1)
        #expect(secretService.stderr.contains("No D-Bus session bus"), "\(secretService.stderr.suffix(500))")
        let dlopened = secretService.stderr.split(separator: "\n").contains {
            $0.contains("file=libsecret-1.so.0") && $0.contains("dynamically loaded by")
        }
        #expect(dlopened, "the Secret Service backend did not dlopen libsecret-1.so.0")
        #expect(Self.loadedLibraries(secretService.stderr).contains { $0.hasPrefix("libglib-2.0.so") })
    }

    /// The sonames of libsecret and the GLib libraries it brings.
    static let desktopLibraries = ["libsecret-1.so", "libglib-2.0.so", "libgobject-2.0.so", "libgio-2.0.so"]

    /// The libraries an LD_DEBUG=files trace shows being loaded (its `file=NAME [...]` lines).
    static func loadedLibraries(_ trace: String) -> [String] {
        trace.split(separator: "\n").compactMap { line in
            guard let start = line.range(of: "file=") else { return nil }
            return String(line[start.upperBound...].prefix { $0 != " " })
        }
    }

    @Test func installedLibrary_resolvesEveryFunction_andTheyWork() throws {
        let library = try LibSecret.open("libsecret-1.so.0")
        #expect(library.secret_service_get_type() != 0)
        #expect(library.g_io_error_quark() != library.secret_error_get_quark())
        let cancellation = Cancellation(library: library)
        #expect(!cancellation.isCancelled)
        cancellation.cancel()
        #expect(cancellation.isCancelled)
        let attributes = ["service": "on-demand", "account": "alice", "xdg:schema": "org.freedesktop.Secret.Generic"]
        let dictionary = VariantValue.stringDictionary(attributes, library: library)
        #expect(dictionary.typeString == "a{ss}")
        #expect(dictionary.stringDictionary == attributes)
        let arguments = VariantValue.tuple([dictionary, .string("label", library: library)], library: library)
        #expect(arguments.typeString == "(a{ss}s)")
        #expect(arguments.children.last?.string == "label")
        #expect(VariantValue.boxed(.string("x", library: library), library: library).unboxed?.string == "x")
        #expect(dictionary.bool == nil && dictionary.objectPaths == nil)
        // The process's own table is the same library.
        #expect(try LibSecret.load().secret_service_get_type() == library.secret_service_get_type())
    }

    @Test func missingLibrary_throwsNotAvailable_namingItAndThePackageToInstall() {
        let error = expectError(.notAvailable) { try LibSecret.open(Self.missingLibrary) }
        #expect(error?.message.contains(Self.missingLibrary) == true, "\(String(describing: error))")
        #expect(error?.message.contains("apt-get install libsecret-1-0") == true)
    }

    @Test func libraryWithoutTheFunctions_throwsNotAvailable_namingTheMissingFunction() {
        let error = expectError(.notAvailable) { try LibSecret.open("libc.so.6") }
        #expect(
            error?.message.contains("libc.so.6 does not provide the function secret_service_get_type") == true,
            "\(String(describing: error))")
        #expect(error?.message.contains("apt-get install libsecret-1-0") == true)
    }

    @Test func storeWithoutLibsecret_throwsNotAvailableFromEveryCall_neverItemNotFound() {
        let store = SecretServiceStore(
            configuration: .init(busAddress: "unix:path=/nonexistent/bus"),
            library: { () throws(LockboxError) in try LibSecret.open(Self.missingLibrary) })
        let calls: [(String, () throws -> Void)] = [
            ("checkAvailable", { try store.checkAvailable() }),
            ("items", { _ = try store.items(matching: .genericPassword(service: "on-demand")) }),
            ("add", { try store.add(.genericPassword(service: "on-demand", account: "a", data: SecretBytes(utf8: "v"))) }),
            ("update", { try store.update(matching: .genericPassword(service: "on-demand"), to: ItemUpdate(data: SecretBytes(utf8: "w"))) }),
            ("delete", { try store.delete(matching: .genericPassword(service: "on-demand")) }),
            ("slotKey", { _ = try store.slotKey(vaultIdentifier: "on-demand") }),
            ("deleteSlotKey", { try store.deleteSlotKey(vaultIdentifier: "on-demand") }),
        ]
        for (name, call) in calls {
            let error = expectError(.notAvailable, call)
            #expect(error?.message.contains("apt-get install libsecret-1-0") == true, "\(name): \(String(describing: error))")
            #expect(error?.message.contains(Self.missingLibrary) == true, "\(name)")
        }
    }
}
