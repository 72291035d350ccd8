import Posix
import Testing

/// A wake is never lost, and wakes that pile up before a wait cost one write: the second
/// finds the first not yet read.
@Suite struct WakeupTests {
    @Test func wakesBeforeAWaitEndItOnceAndAWakeAfterItIsNotLost() {
        let wakeup = Wakeup()
        #expect(wakeup.fd >= 0)
        for _ in 0..<3 { wakeup.wake() }
        var started = ContinuousClock.now
        wakeup.wait(until: .now + .seconds(5))
        #expect(started.duration(to: .now) < .seconds(1), "the wakes ended the wait")
        started = .now
        wakeup.wait(until: .now + .milliseconds(50))
        #expect(started.duration(to: .now) >= .milliseconds(50), "all three were read at once")
        wakeup.wake()  // after a wait that read the earlier ones: written again
        started = .now
        wakeup.wait(until: .now + .seconds(5))
        #expect(started.duration(to: .now) < .seconds(1), "the wake after the wait ended the next one")
    }
}
