import SecureMemory
/// The accounts of a vault folder as a pure function of its changes (format 3; the rule
/// in `docs/vault-format-3.md`, "Merging"): machines that hold the same files compute the
/// same accounts, whatever order the files came in.
///
/// Thread-safety: pure functions over values the caller owns.
public enum VaultMerge {
    /// One value of a field, with the change it came in.
    ///
    /// Thread-safety: as `AccountChange`.
    public struct Value: @unchecked Sendable {
        public var id: ChangeID
        public var value: SecureBytes
        public var seen: [UInt64: UInt64]
    }

    /// A field: the value shown, the other current values (its conflicts), and what a new
    /// value of it must say it has seen (every value's clock, per device).
    ///
    /// Thread-safety: as `AccountChange`.
    public struct Field: @unchecked Sendable {
        public var shown: Value
        public var others: [Value]
        /// Every value of the field (superseded ones too), for `seen`.
        var all: [Value]

        /// What a new value of the field must say it has seen: per device, the newest clock
        /// among the values and what they had seen (made when a write asks, not kept).
        public var seen: [UInt64: UInt64] {
            var seen: [UInt64: UInt64] = [:]
            for value in all {
                seen[value.id.device] = max(seen[value.id.device] ?? 0, value.id.clock)
                for (device, clock) in value.seen { seen[device] = max(seen[device] ?? 0, clock) }
            }
            return seen
        }
    }

    /// One account as the changes make it.
    ///
    /// Thread-safety: as `AccountChange`.
    public struct Account: @unchecked Sendable {
        public var uuid: [UInt8]
        public var name: String
        /// By field name; empty while locked.
        public var fields: [String: Field]
        /// Every set change of the account, removed or not: what a removal written now has
        /// seen (and removes).
        public var sets: [ChangeID]
        /// Every removal of the account: what a set written now has seen.
        public var removals: [ChangeID]
        /// Removals that lost against a change made apart and that no later change answered.
        public var removalConflicts: [ChangeID]
        /// Removals that took effect (each removed the set changes it had seen).
        public var effectiveRemovals: [ChangeID]
    }

    /// The accounts (by UUID) of `changes`: every valid change the folder holds.
    public static func accounts(_ changes: [AccountChange]) -> [[UInt8]: Account] {
        var byAccount: [[UInt8]: [Int]] = [:]
        for index in changes.indices { byAccount[changes[index].uuid, default: []].append(index) }
        var result: [[UInt8]: Account] = [:]
        for (uuid, indices) in byAccount {
            if let account = account(uuid, indices.map { changes[$0] }) { result[uuid] = account }
        }
        return result
    }

    /// One account from its changes; nil when it does not exist (never made, or removed).
    ///
    /// The removals in effect are the largest set of removals in which each one, for every
    /// set change it had not seen, finds that the change had seen it (was made after it) or
    /// that another removal in effect had seen the change. Each removal in effect removes
    /// the set changes it had seen. A removal left out (a set change made apart from it
    /// that no removal in effect had seen) removes nothing, and is a conflict until a later
    /// set change (one that had seen the removal) answers it.
    public static func account(_ uuid: [UInt8], _ all: [AccountChange]) -> Account? {
        let changes = distinct(all)
        let sets = changes.filter { $0.kind == .set }
        let removals = changes.filter { $0.kind == .remove }
        let seenBy = removals.map { Set($0.seen) }
        var inEffect = Set(removals.indices)
        var shrinking = !removals.isEmpty
        while shrinking {
            shrinking = false
            for r in Array(inEffect) {
                let holds = sets.allSatisfy { c in
                    seenBy[r].contains(c.id) || c.seen.contains(removals[r].id)
                        || inEffect.contains { $0 != r && seenBy[$0].contains(c.id) }
                }
                if !holds {
                    inEffect.remove(r)
                    shrinking = true
                }
            }
        }
        var covered = Set<ChangeID>()
        for r in inEffect { covered.formUnion(seenBy[r]) }
        let void = removals.indices.filter { !inEffect.contains($0) }.map { removals[$0] }
        let effective = inEffect.map { removals[$0].id }
        let live = sets.filter { !covered.contains($0.id) }
        guard let newest = live.max(by: { $0.id < $1.id }) else { return nil }
        let unanswered = void.filter { removal in !live.contains { $0.seen.contains(removal.id) } }
        var values: [String: [Value]] = [:]
        for change in live {
            for field in change.fields ?? [] {
                values[field.name, default: []].append(Value(id: change.id, value: field.value, seen: field.seen))
            }
        }
        var fields: [String: Field] = [:]
        for (name, all) in values {
            // A value is superseded when another had seen its clock: per device, the two
            // greatest clocks seen (by two different values) tell it for every value at once
            // (linear in the values: one field changed 2,500 times between folds).
            var best: [UInt64: (clock: UInt64, id: ChangeID, second: UInt64)] = [:]
            for w in all {
                for (device, clock) in w.seen {
                    guard let top = best[device] else {
                        best[device] = (clock, w.id, 0)
                        continue
                    }
                    if w.id == top.id {
                        best[device] = (max(top.clock, clock), top.id, top.second)
                    } else if clock > top.clock {
                        best[device] = (clock, w.id, top.clock)
                    } else {
                        best[device] = (top.clock, top.id, max(top.second, clock))
                    }
                }
            }
            let current = all.filter { v in
                guard let top = best[v.id.device] else { return true }
                return (top.id != v.id ? top.clock : top.second) < v.id.clock
            }.sorted { $0.id > $1.id }
            guard let shown = current.first else { continue }  // (cannot be: the newest is never superseded)
            fields[name] = Field(shown: shown, others: Array(current.dropFirst()), all: all)
        }
        return Account(uuid: uuid, name: newest.name, fields: fields, sets: sets.map(\.id).sorted(),
                       removals: removals.map(\.id).sorted(), removalConflicts: unanswered.map(\.id).sorted(),
                       effectiveRemovals: effective.sorted())
    }

    /// One change found in two files (a folded file beside the files it replaced, which a
    /// synchroniser has not removed yet) counts once, with the fields of both (a fold
    /// drops only values that are no longer current).
    static func distinct(_ changes: [AccountChange]) -> [AccountChange] {
        var byID: [ChangeID: AccountChange] = [:]
        var order: [ChangeID] = []
        for change in changes {
            guard var known = byID[change.id] else {
                byID[change.id] = change
                order.append(change.id)
                continue
            }
            if let more = change.fields {
                let names = Set((known.fields ?? []).map(\.name))
                known.fields = (known.fields ?? []) + more.filter { !names.contains($0.name) }
                byID[change.id] = known
            }
        }
        return order.compactMap { byID[$0] }
    }

    /// What a device keeps of its own changes when it folds them into one file, so that
    /// the accounts stay the same whatever files arrive later: every removal, and every
    /// set change with the values that are current when no removal is counted (a removal
    /// in effect now loses its effect if a change made apart from it arrives, and then the
    /// values it removed are current again; a value that another value has seen can never
    /// be current again). A change left without values is kept only when a removal has not
    /// seen it (it decides whether that removal takes effect) or it is the account's newest
    /// (it names the account). Other devices' changes decide what is current but are never
    /// written.
    public static func fold(_ changes: [AccountChange], device: UInt64) -> [AccountChange] {
        let all = distinct(changes)
        let unremoved = accounts(all.filter { $0.kind == .set })
        var byAccount: [[UInt8]: [AccountChange]] = [:]
        for change in all { byAccount[change.uuid, default: []].append(change) }
        var kept: [AccountChange] = []
        for (uuid, list) in byAccount {
            let removals = list.filter { $0.kind == .remove }
            kept += removals.filter { $0.id.device == device }
            guard let account = unremoved[uuid] else { continue }
            let newest = list.filter { $0.kind == .set }.map(\.id).max()
            for change in list where change.kind == .set && change.id.device == device {
                var trimmed = change
                trimmed.fields = change.fields?.filter { field in
                    account.fields[field.name].map { f in f.shown.id == change.id || f.others.contains { $0.id == change.id } } ?? false
                }
                let needed = !(trimmed.fields ?? []).isEmpty || change.id == newest
                    || removals.contains { !$0.seen.contains(change.id) }
                if needed { kept.append(trimmed) }
            }
        }
        return kept.sorted { $0.id < $1.id }
    }
}
