package txguard

// Watched returns the number of leases watched. Only the tests need it.
func (g *Guard) Watched() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.watched
}

// Arms returns how many times the guard's timer was set.
func (g *Guard) Arms() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.arms
}
