// libFuzzer's own `main` cannot be used: SwiftPM links an executable target's entry point as
// `main`. This one hands the command line to libFuzzer's driver, which then behaves exactly
// like a libFuzzer binary (`-runs`, `-max_total_time`, corpus directories, crash artifacts).

import Foundation

@_silgen_name("LLVMFuzzerRunDriver")
func runFuzzerDriver(
    _ argc: UnsafeMutablePointer<Int32>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32
) -> Int32

var argumentCount = CommandLine.argc
var argumentVector = CommandLine.unsafeArgv
exit(runFuzzerDriver(&argumentCount, &argumentVector) { data, size in fuzzOneInput(data, size) })
