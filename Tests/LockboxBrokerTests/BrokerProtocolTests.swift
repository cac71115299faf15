import LockboxCore
import Testing

@testable import LockboxBroker

@Suite struct BrokerProtocolTests {
    @Test func unknownOperation_isRefused() {
        var encoder = FieldEncoder()
        encoder.integer(99)
        #expect(throws: LockboxError.self) { try BrokerRequest(decoding: encoder.bytes) }
    }
}
