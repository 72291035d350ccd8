extension ContinuousClock.Instant {
    /// Seconds from this instant until now (the clock counts time suspended too, so an
    /// auto-lock deadline passes while the machine sleeps).
    public var secondsElapsed: Double {
        let elapsed = duration(to: .now).components
        return Double(elapsed.seconds) + Double(elapsed.attoseconds) / 1e18
    }
}
