package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aethermesh/aether/edge"
)

// edgeStopTimeout bounds a graceful stop: in-flight RPCs get this long
// after SIGTERM before the server closes under them (etcd's harness waits
// for the process to exit).
const edgeStopTimeout = 10 * time.Second

// edgeConfig is the server configuration the settings ask for.
func (s *edgeSettings) edgeConfig() edge.Config {
	return edge.Config{
		Name:                        s.Name,
		DataDir:                     s.DataDir,
		ListenClientURLs:            s.ListenClientURLs,
		AdvertiseClientURLs:         s.AdvertiseClientURLs,
		ListenPeerURLs:              s.ListenPeerURLs,
		AdvertisePeerURLs:           s.AdvertisePeerURLs,
		InitialCluster:              s.InitialCluster,
		InitialClusterState:         s.InitialClusterState,
		InitialClusterToken:         s.InitialClusterToken,
		ClientTLS:                   s.ClientTLS,
		PeerTLS:                     s.PeerTLS,
		MaxRequestBytes:             s.MaxRequestBytes,
		MaxTxnOps:                   s.MaxTxnOps,
		Logger:                      s.Logger,
		WatchProgressNotifyInterval: s.WatchProgressNotifyInterval,
		QuotaBackendBytes:           s.QuotaBackendBytes,
		AutoCompactionMode:          s.AutoCompactionMode,
		AutoCompactionRetention:     s.AutoCompactionRetention,
		SyncPeers:                   s.SyncPeers,
		SyncInterval:                s.SyncInterval,
		PeerCommitDelay:             s.PeerCommitDelay,
		DisableHistoryGC:            !s.HistoryGC,
		PeerRetention:               s.PeerRetention,
		CheckpointChanges:           s.CheckpointChanges,
		CheckpointBytes:             s.CheckpointBytes,
		ValueMerge:                  s.ValueMerge,
		ValueMergePrefixes:          s.ValueMergePrefixes,
		EnablePprof:                 s.EnablePprof,
	}
}

// runEdge serves the edge store until ctx is cancelled (SIGINT, SIGTERM),
// then stops gracefully. edge.Start logs etcd's "ready to serve client
// requests" line once it listens.
func runEdge(ctx context.Context, s *edgeSettings) error {
	s.Logger.Info("starting aether edge", "etcd-version", edgeEtcdVersion, "aether-version", versionString(),
		"name", s.Name, "data-dir", s.DataDir)
	srv, err := edge.Start(ctx, s.edgeConfig())
	if err != nil {
		return fmt.Errorf("edge: start: %w", err)
	}
	<-ctx.Done()
	s.Logger.Info("received signal; shutting down")
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), edgeStopTimeout)
	defer cancel()
	if err := srv.Close(stopCtx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("edge: stop: %w", err)
	}
	return nil
}
