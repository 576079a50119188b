package netpolicy

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// localZones are zones that only the host's own network answers: asked
// of the host's resolver they describe the host's surroundings (in
// Kubernetes, where that resolver is the cluster's DNS, every service by
// SRV and TXT), and asked of any other they are noise. No sandbox's
// lookup under them leaves the host, whatever its policy says.
var localZones = []string{
	"cluster.local", // Kubernetes' default cluster domain
	"svc",           // Kubernetes' services, as search domains complete them
	"local",         // multicast DNS, and some clusters' domain
	"localhost",     // RFC 6761
	"internal",      // private use (ICANN 2024); clouds name metadata services and VMs here
	"home.arpa",     // RFC 8375, home networks
}

// isLocal reports whether name belongs to the host's network: a single
// label (which a stub resolver would complete with the host's search
// domains, and which no public name is used as), or a name in
// localZones, the host's search domains or the operator's zones.
func (f *filter) isLocal(name string) bool {
	if !strings.Contains(name, ".") {
		return true
	}
	for _, z := range localZones {
		if inZone(name, z) {
			return true
		}
	}
	for _, z := range f.local {
		if inZone(name, z) {
			return true
		}
	}
	return false
}

// resolvConf reads the name servers (IPv4, as host:port) and the search
// domains of a resolv.conf; a file that cannot be read has neither.
func resolvConf(path string) (servers, search []string) {
	servers = []string{}
	f, err := os.Open(path)
	if err != nil {
		return servers, nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "nameserver":
			if a, err := netip.ParseAddr(fields[1]); err == nil && a.Is4() {
				servers = append(servers, netip.AddrPortFrom(a, 53).String())
			}
		case "search", "domain":
			for _, d := range fields[1:] {
				if d = strings.ToLower(strings.TrimSuffix(d, ".")); hostName(d) {
					search = append(search, d)
				}
			}
		}
	}
	return servers, search
}

// zoneNames checks the operator's zones (config network.localZones) and
// returns them lower case, without a final dot.
func zoneNames(zones []string) ([]string, error) {
	out := make([]string, 0, len(zones))
	for _, z := range zones {
		n := strings.ToLower(strings.TrimSuffix(z, "."))
		if !hostName(n) {
			return nil, fmt.Errorf("local zone %q is not a DNS name", z)
		}
		out = append(out, n)
	}
	return out, nil
}
