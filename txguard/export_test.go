package txguard

// Watched returns the number of leases watched. Only the tests need it.
func (g *Guard) Watched() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.watched
}
