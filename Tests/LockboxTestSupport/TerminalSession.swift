import Foundation

/// Runs a program on a real pseudo-terminal (its controlling terminal, so `/dev/tty` is it)
/// and plays a script against it: wait for a text, then type an answer. Python's `pty.fork`
/// does the session and controlling-terminal set-up that Foundation's `Process` cannot.
public struct TerminalSession {
    public enum Step: Encodable, Sendable {
        /// Waits until the program has written `text` (after what the last wait matched).
        case expect(String)
        /// Types `text` (a line needs its "\n"; the terminal turns Enter into it too).
        case type(String)

        public func encode(to encoder: Encoder) throws {
            var container = encoder.unkeyedContainer()
            switch self {
            case .expect(let text): try container.encode("expect"); try container.encode(text)
            case .type(let text): try container.encode("type"); try container.encode(text)
            }
        }
    }

    public struct Outcome: Sendable {
        public var status: Int32
        /// Everything the program wrote on the terminal (the terminal echoes what was typed
        /// only while echo is on).
        public var transcript: String
        /// Empty when every step ran; otherwise which `expect` was never met.
        public var failure: String
    }

    static let driver = #"""
        import json, os, pty, select, signal, sys, time
        steps = json.loads(sys.argv[1])
        argv = sys.argv[2:]
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(argv[0], argv)
        buffer = b""
        mark = 0
        failure = ""
        def pump(deadline):
            global buffer
            ready, _, _ = select.select([fd], [], [], max(0, deadline - time.time()))
            if not ready:
                return True
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return False
            if not chunk:
                return False
            buffer += chunk
            return True
        for kind, text in steps:
            if kind == "type":
                os.write(fd, text.encode())
                continue
            needle = text.encode()
            deadline = time.time() + 60
            while buffer.find(needle, mark) < 0 and time.time() < deadline:
                if not pump(deadline):
                    break
            found = buffer.find(needle, mark)
            if found < 0:
                failure = "never saw %r" % text
                os.kill(pid, signal.SIGKILL)
                break
            mark = found + len(needle)
        deadline = time.time() + 60
        while time.time() < deadline and pump(deadline):
            pass
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"status": code, "transcript": buffer.decode("utf-8", "replace"), "failure": failure}))
        """#

    /// Why the terminal driver could not run: names what is missing.
    public struct DriverFailure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Runs `executable` with `arguments` on a new terminal and plays `steps`.
    public static func run(
        _ executable: String, _ arguments: [String], steps: [Step], environment: [String: String]? = nil
    ) throws -> Outcome {
        guard
            let python = ProcessInfo.processInfo.environment["PATH", default: "/usr/bin:/bin"].split(separator: ":")
                .map({ "\($0)/python3" }).first(where: { FileManager.default.isExecutableFile(atPath: $0) })
        else {
            throw DriverFailure(description: "python3 not found on PATH: the terminal tests drive a pseudo-terminal with it (install python3)")
        }
        let script = String(decoding: try JSONEncoder().encode(steps), as: UTF8.self)
        let result = try LockboxTestSupport.run(
            python, ["-c", driver, script, executable] + arguments, environment: environment, timeout: 180)
        guard result.status == 0 else { throw DriverFailure(description: "the terminal driver failed: \(result.standardError)") }
        guard let decoded = try JSONSerialization.jsonObject(with: Data(result.standardOutputBytes)) as? [String: Any] else {
            throw DriverFailure(description: "the terminal driver printed no outcome: \(result.standardOutput)")
        }
        return Outcome(
            status: Int32(decoded["status"] as? Int ?? -1), transcript: decoded["transcript"] as? String ?? "",
            failure: decoded["failure"] as? String ?? "")
    }
}
