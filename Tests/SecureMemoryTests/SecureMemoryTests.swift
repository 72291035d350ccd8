import Posix
@testable import SecureMemory
import Testing

/// Secure memory's budget arithmetic, and values that hold secrets. Spending the process's
/// real budget is left to the mounted test (`SecureMemoryExhaustionTests`): the test bundle
/// runs suites side by side, which would find the memory gone.
@Suite struct SecureMemoryTests {
    @Test func theLedgerAdmitsUpToItsBudgetAndNoFurther() {
        var ledger = SecureMemoryLedger(byteBudget: 100, regionBudget: 3)
        let first = ledger.admit(60), over = ledger.admit(41), second = ledger.admit(40)  // 41: 101 bytes
        #expect(first && !over && second)
        #expect((ledger.bytes, ledger.regions) == (100, 2))
        let full = ledger.admit(1)
        #expect(!full)
        ledger.release(40)
        let fifth = ledger.admit(1), sixth = ledger.admit(1)
        #expect(fifth && sixth)
        let fourthRegion = ledger.admit(1)
        #expect(!fourthRegion)
        let zero = ledger.admit(0), negative = ledger.admit(-5)
        #expect(!zero && !negative)
    }

    @Test func valuesCountAgainstTheBudgetUntilWiped() throws {
        let value = try SecureBytes(copying: Array("secret".utf8))
        let grown = try SecureBytes(count: 3 << 20)
        #expect(SecureMemory.held.bytes >= (3 << 20) + 6)
        try value.append(Array(" and more".utf8))
        value.withUnsafeBytes { #expect(Array($0) == Array("secret and more".utf8)) }
        try value.resize(to: 3)
        value.withUnsafeBytes { #expect(Array($0) == Array("sec".utf8)) }
        grown.wipe()
        value.wipe()
        #expect(value.isWiped && value.count == 0)
    }

    @Test func anEmptyValueHoldsNoMemoryUntilWritten() throws {
        let empty = SecureBytes()
        #expect(empty.count == 0 && empty.isWiped)
        let sevens = [UInt8](repeating: 7, count: 4)
        let written: Void? = sevens.withUnsafeBytes { try? empty.write($0, at: 2) }
        #expect(written != nil)
        empty.withUnsafeBytes { #expect(Array($0) == [0, 0, 7, 7, 7, 7]) }
        empty.wipe()
    }

    @Test func anArenaSharesSlabsAndGivesThemBack() throws {
        let arena = SecureArena()
        var values: [SecureBytes] = []
        for index in 0..<100 {
            let bytes = [UInt8](repeating: UInt8(index), count: 20)
            values.append(try #require(bytes.withUnsafeBytes { try? SecureBytes.allocate(copying: $0, in: arena) }))
        }
        #expect(arena.slabCount == 1)
        #expect(arena.bytesHeld == SecureArena.defaultSlabSize)
        values.forEach { $0.wipe() }
        arena.releaseAll()
        #expect(arena.slabCount == 0)
    }
}
