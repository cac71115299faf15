/// Times the phases of one run into a timings value: each ``lap(_:)`` adds the time since the
/// previous one (or the start) to a phase.
struct PhaseTimer<Timings> {
    var timings: Timings
    private let clock = ContinuousClock()
    private var mark: ContinuousClock.Instant

    init(_ timings: Timings) {
        self.timings = timings
        mark = clock.now
    }

    mutating func lap(_ phase: WritableKeyPath<Timings, Duration>) {
        let now = clock.now
        timings[keyPath: phase] += now - mark
        mark = now
    }
}
